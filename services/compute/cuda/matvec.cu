#include "services/compute/cuda/matvec.cuh"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/kquant_dot.cuh"
#include "services/compute/cuda/kquant_matvec.cuh"
#include "services/compute/cuda/mma_q8_0.cuh"
#include "services/compute/cuda/mma_q8_0_tiles.cuh"
#include "services/compute/cuda/mma_tile_kernels.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/staged_dots.cuh"
#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {
namespace {

constexpr int kRows = 1;   // weight rows per lane group (more groups: more loads in flight)
constexpr int kWarps = 4;  // warps per block
constexpr int kMaxOutputs = 3;

struct MatvecArgs {
  MatvecOutput o[kMaxOutputs];
  int64_t row_begin[kMaxOutputs + 1];  // concatenated row ranges
  int n_outputs;
  DevAct act;
  int n_tokens;
  bool prefetch_l2;  // each lane group pulls its rows into L2 before waiting (kL2PrefetchMaxBytes)
  bool stage_act;    // the block's activation rows are copied into shared memory (StageActRows)
};

// A launch's weights that its first wave may prefetch into L2 without pushing out what it needs:
// Q/K/V (11 MB on the 30B geometry) yes, the 330 MB LM head no.
constexpr int64_t kL2PrefetchMaxBytes = 24ll << 20;

template <int kType, int NT>
__global__ void __launch_bounds__(kWarps * 32) MatvecKernel(const __grid_constant__ MatvecArgs args) {
  AllowDependents();
  constexpr int G = kGroup<kType>, kGroupsPerWarp = 32 / G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // Each group of G lanes takes kRows consecutive rows of the concatenated matrices.
  const int64_t grow = ((int64_t(blockIdx.x) * kWarps + warp) * kGroupsPerWarp + lane / G) * kRows;
  int m = 0;
  while (m + 1 < args.n_outputs && grow >= args.row_begin[m + 1]) ++m;
  const bool active = grow < args.row_begin[args.n_outputs];
  const MatvecOutput& o = args.o[m];
  const int64_t row0 = grow - args.row_begin[m];
  RowRef rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = active && row0 + r < o.w.rows ? MatrixRow<kType>(o.w, row0 + r) : RowRef{};
  if (args.prefetch_l2) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) PrefetchRowToL2<kType, G>(rows[r], o.w.cols);
  }
  WaitForPredecessor();
  const int t0 = blockIdx.y * NT;
  const uint8_t* act_rows[NT];
  const float* act_scales[NT];
  const int64_t rb = ActRowBytes(args.act.type, args.act.stride);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const bool valid = t0 + t < args.n_tokens;
    act_rows[t] = valid ? args.act.data + int64_t(t0 + t) * rb : nullptr;
    act_scales[t] = valid && kType == kDevQ8_0 ? args.act.scales + int64_t(t0 + t) * (args.act.stride / 32) : nullptr;
  }
  if (args.stage_act) {  // the block's token rows in shared memory (StageActRows)
    extern __shared__ uint4 act_smem[];
    StageActRows<kType, NT>(act_smem, act_rows, act_scales, args.o[0].w.cols);
  }
  float acc[kRows][NT];
  GroupDots<kType, kRows, NT, NT == 1 ? 8 : 2>(rows, args.o[0].w.cols, act_rows, act_scales, acc);
  if (lane % G != 0) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (rows[r].q == nullptr || act_rows[t] == nullptr) continue;
      const int64_t i = int64_t(t0 + t) * o.out_stride + row0 + r;
      o.out[i] = o.residual != nullptr ? __fadd_rn(o.residual[i], acc[r][t]) : acc[r][t];
    }
}

// Several tokens of Q8_0 rows (prompts, batches) whose rows fit in shared memory: each lane
// group stages 2 consecutive rows of one matrix with cp.async (StagedDots), the block its 32
// rows, and computes them for its kStagedTokens tokens (block row blockIdx.y), all staged at once.
// The register path re-reads a row from L2 for every 8 tokens and pays an L2 round trip per run;
// here the rows are read once per block. The weights depend on no earlier kernel, so their copies
// are issued before the wait. 8 tokens per block rather than 16 (more, shorter blocks): on the
// H200, 30B geometry, 31-token prompts, 1,961-1,969 against 1,929-1,930 tokens/s and
// 16 for the 4,096-column output projection alone was slower too (1,942-1,950 against
// 1,976-1,980).
constexpr int kStagedTokens = 8, kStagedNT = 8;

__global__ void __launch_bounds__(kWarps * 32) MatvecStagedKernel(const __grid_constant__ MatvecArgs args) {
  extern __shared__ uint4 staged[];
  AllowDependents();
  constexpr int G = kGroup<kDevQ8_0>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = ((int64_t(blockIdx.x) * kWarps + warp) * (32 / G) + lane / G) * 2;
  int m = 0;
  while (m + 1 < args.n_outputs && grow >= args.row_begin[m + 1]) ++m;
  const bool active = grow < args.row_begin[args.n_outputs];
  const MatvecOutput& o = args.o[m];
  const int64_t row0 = grow - args.row_begin[m];
  RowRef rows[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) rows[r] = active && row0 + r < o.w.rows ? MatrixRow<kDevQ8_0>(o.w, row0 + r) : RowRef{};
  const int t_begin = blockIdx.y * kStagedTokens;
  const int64_t rb = ActRowBytes(args.act.type, args.act.stride);
  StagedDots<kStagedNT>(
      staged, rows, args.o[0].w.cols, [] { WaitForPredecessor(); }, min(kStagedTokens, args.n_tokens - t_begin),
      [&](int i) { return t_begin + i; },
      [&](int t, const uint8_t** q, const float** s) {
        *q = args.act.data + int64_t(t) * rb;
        *s = args.act.scales + int64_t(t) * (args.act.stride / 32);
      },
      [&](int t, const float(&sum)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if (rows[r].q == nullptr) continue;
          const int64_t i = int64_t(t) * o.out_stride + row0 + r;
          o.out[i] = o.residual != nullptr ? __fadd_rn(o.residual[i], sum[r]) : sum[r];
        }
      });
}

// The staged kernel for these outputs; false where the rows do not fit (up to 4,096 columns) or a
// matrix has an odd number of rows (a lane group's 2 rows must be in one matrix).
bool LaunchStaged(const MatvecArgs& args, int64_t total_rows, cudaStream_t stream) {
  const int64_t cols = args.o[0].w.cols;
  for (int i = 0; i < args.n_outputs; ++i)
    if (args.o[i].w.rows % 2 != 0) return false;
  const int threads = kWarps * 32;
  constexpr int kRowsPerBlock = kWarps * (32 / kGroup<kDevQ8_0>)*2;
  const dim3 grid(static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock),
                  static_cast<unsigned>((args.n_tokens + kStagedTokens - 1) / kStagedTokens));
  if (!StagedFits(kDevQ8_0, cols, threads, kStagedNT)) return false;
  static const bool limit_set = (SetStagedSmemLimit(MatvecStagedKernel), true);
  (void)limit_set;
  LaunchPdl(MatvecStagedKernel, grid, dim3(threads), StagedSmemBytes(cols, threads, kStagedNT), stream, args);
  return true;
}

// Several tokens of Q8_0 rows on the tensor cores (mma_q8_0.cuh): a warp takes 16 consecutive
// rows of the concatenated matrices (every matrix a multiple of 16 rows, so never two), the block
// 64, for up to 8 kTiles tokens staged at once (2 tiles in the exact form: ~250 registers, 2 blocks
// per SM; MmaFastTiles in the fast one, ~130 registers at 2).
// Tokens run along the grid's x, so the blocks that read the same rows run together and all but
// the first find them in L2 (a batch's LM head).
constexpr int kMmaRowsPerBlock = kWarps * kMmaRows;

template <bool kExact, int kTiles>
__global__ void __launch_bounds__(kWarps * 32, 2) MatvecMmaKernel(const __grid_constant__ MatvecArgs args) {
  constexpr int kSlots = kTiles * kMmaTokens;
  extern __shared__ uint4 mma_smem[];
  AllowDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t grow = int64_t(blockIdx.y) * kMmaRowsPerBlock + warp * kMmaRows + gid;  // and grow + 8
  int m = 0;
  while (m + 1 < args.n_outputs && grow >= args.row_begin[m + 1]) ++m;
  const bool active = grow < args.row_begin[args.n_outputs];
  const MatvecOutput& o = args.o[m];
  const int64_t row0 = grow - args.row_begin[m];
  const RowRef lo = active ? MatrixRow<kDevQ8_0>(o.w, row0) : RowRef{};
  const RowRef hi = active ? MatrixRow<kDevQ8_0>(o.w, row0 + 8) : RowRef{};
  const int64_t cols = args.o[0].w.cols, rb = ActRowBytes(args.act.type, args.act.stride);
  const int t0 = blockIdx.x * kSlots, n = min(kSlots, args.n_tokens - t0);
  uint8_t* smem = reinterpret_cast<uint8_t*>(mma_smem);
  PrefetchRowToL2<kDevQ8_0, 4>(lo, cols);  // the 4 lanes of a row (tig) share its lines
  PrefetchRowToL2<kDevQ8_0, 4>(hi, cols);
  WaitForPredecessor();
  MmaStageAct(smem, cols, kSlots, n, [&](int i, const uint8_t** q, const float** s) {
    *q = args.act.data + int64_t(t0 + i) * rb;
    *s = args.act.scales + int64_t(t0 + i) * (args.act.stride / 32);
  });
  __syncthreads();
  float sums[kTiles][4];
  MmaQ8_0Dots<kTiles, kExact>(lo, hi, cols, smem, kSlots, (n + kMmaTokens - 1) / kMmaTokens, sums);
  if (!active) return;
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // C element c: row row0 (+ 8 for c >= 2), token 2 tig + c % 2
      const int i = t * kMmaTokens + 2 * tig + c % 2;
      if (i >= n) continue;
      const int64_t at = int64_t(t0 + i) * o.out_stride + row0 + (c >= 2 ? 8 : 0);
      o.out[at] = o.residual != nullptr ? __fadd_rn(o.residual[at], sums[t][c]) : sums[t][c];
    }
}

// The mma kernel for these outputs; false where the dp4a kernels take them (MultiTokenQ8_0), a
// matrix's rows are not a multiple of 16, or the tokens' rows do not fit in shared memory.
bool LaunchMma(const MatvecArgs& args, int64_t total_rows, cudaStream_t stream) {
  const int64_t cols = args.o[0].w.cols;
  const int tiles = MmaTilesTaking(kDevQ8_0, cols);
  if (tiles == 0) return false;
  if (MultiTokenQ8_0Kernels() == MultiTokenQ8_0::kAuto && args.n_tokens < kMmaAutoMinTokens) return false;
  for (int i = 0; i < args.n_outputs; ++i)
    if (args.o[i].w.rows % kMmaRows != 0) return false;
  WithMmaForm(MultiTokenQ8_0Exact(), tiles, [&](auto kExact, auto kTiles) {
    const auto kernel = MatvecMmaKernel<decltype(kExact)::value, decltype(kTiles)::value>;
    static const bool limit_set = (SetStagedSmemLimit(kernel), true);  // one per instance
    (void)limit_set;
    constexpr int kSlots = decltype(kTiles)::value * kMmaTokens;
    const dim3 grid(static_cast<unsigned>((args.n_tokens + kSlots - 1) / kSlots),
                    static_cast<unsigned>((total_rows + kMmaRowsPerBlock - 1) / kMmaRowsPerBlock));
    LaunchPdl(kernel, grid, dim3(kWarps * 32), MmaActSmemBytes(cols, kSlots), stream, args);
  });
  return true;
}

// The tiled kernel for these outputs; false where the fast form or its tiles are not chosen for
// the step's tokens (MultiTokenQ8_0, FastTiles) or the rows do not fit the tiles.
bool LaunchTiled(const MatvecArgs& args, int64_t total_rows, cudaStream_t stream) {
  if (MultiTokenQ8_0Kernels() != MultiTokenQ8_0::kMmaFast || !FastTilesTakeMatvec(args.n_tokens) ||
      !MmaTilesFit(args.o[0].w.type, args.o[0].w.cols, args.act.stride))
    return false;
  WithMmaTileTokens(args.n_tokens,
                    [&](auto kBN) { LaunchMatvecTiled<Q8_0Tiles<decltype(kBN)::value>>(args, total_rows, stream); });
  return true;
}

// One token, Q8_0 rows that WarpQ8_0Fits: a warp per row (WarpQ8_0Rows). The weight loads are
// issued before waiting for the kernel that writes the activations.
__global__ void __launch_bounds__(kWarps * 32, 4) MatvecQ8_0DecodeKernel(const __grid_constant__ MatvecArgs args) {
  extern __shared__ float smem[];
  AllowDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = int64_t(blockIdx.x) * kWarps + warp;
  int m = 0;
  while (m + 1 < args.n_outputs && grow >= args.row_begin[m + 1]) ++m;
  const MatvecOutput& o = args.o[m];
  const int64_t row = grow - args.row_begin[m];
  const bool active = grow < args.row_begin[args.n_outputs] && row < o.w.rows;
  const int64_t nb = o.w.cols / 32;
  const RowRef rows[1] = {active ? MatrixRow<kDevQ8_0>(o.w, row) : RowRef{}};
  WarpQ8_0Rows<1> dot;
  dot.Load(rows, nb);
  WaitForPredecessor();
  float acc[1];
  dot.Finish(rows, nb, args.act.data, args.act.scales, smem + warp * kWarpQ8_0SmemFloats(1, nb), acc);
  if (lane != 0 || !active) return;
  o.out[row] = o.residual != nullptr ? __fadd_rn(o.residual[row], acc[0]) : acc[0];
}

// The lane-group kernel over bx blocks of rows, NT tokens per block row, with the tokens'
// activation rows staged in shared memory where they fit.
template <int kType, int NT>
void LaunchLaneGroups(MatvecArgs args, unsigned bx, cudaStream_t stream) {
  const int64_t smem = StagedActSmem<kType>(NT, args.o[0].w.cols);
  args.stage_act = smem > 0;
  LaunchPdl(MatvecKernel<kType, NT>, dim3(bx, (args.n_tokens + NT - 1) / NT), dim3(kWarps * 32), smem, stream, args);
}

template <int kType>
void Launch(const MatvecArgs& args, int64_t total_rows, cudaStream_t stream) {
  constexpr int kRowsPerBlock = kWarps * (32 / kGroup<kType>)*kRows;
  const unsigned bx = static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  const int64_t cols = args.o[0].w.cols;
  // Measured on the H200 (30B geometry, in place): a warp per row pays off for long rows, whose chains the
  // lane-group path would feed in several rounds of loads (the 4,096-column output projection:
  // 11.8 vs 17.7 us); on 2,048 columns the lane groups are as fast or faster (Q/K/V 11.7 vs
  // 12.8 us, the LM head 102 vs 190 us).
  if (kType == kDevQ8_0 && args.n_tokens == 1 && cols >= 4096 && WarpQ8_0Fits(1, cols)) {
    const unsigned blocks = static_cast<unsigned>((total_rows + kWarps - 1) / kWarps);
    LaunchPdl(MatvecQ8_0DecodeKernel, dim3(blocks), dim3(kWarps * 32),
              kWarps * kWarpQ8_0SmemFloats(1, cols / 32) * sizeof(float), stream, args);
    return;
  }
  if (args.n_tokens == 1) {
    LaunchLaneGroups<kType, 1>(args, bx, stream);
    return;
  }
  if (kType == kDevQ8_0 && LaunchTiled(args, total_rows, stream)) return;
  if (kType == kDevQ8_0 && LaunchMma(args, total_rows, stream)) return;
  if (kType == kDevQ8_0 && LaunchStaged(args, total_rows, stream)) return;
  if (StagedActSmem<kType>(8, cols) == 0 && StagedActSmem<kType>(4, cols) > 0) {
    // 4 tokens per block where 8 rows would not fit in shared memory (a prompt's f32 router:
    // 8 x 8 KB), since activations read from global memory inside the chains cost an L2 round
    // trip per step (StageActRows): the 30B geometry's prompt routing 54 -> 36 us per layer.
    LaunchLaneGroups<kType, 4>(args, bx, stream);
  } else {
    LaunchLaneGroups<kType, 8>(args, bx, stream);
  }
}

// The process-wide multi-token kernel settings (multi_token_kernels.h): -1 until the first read,
// which takes the environment; the setters (tests, benchmarks) override it.
std::atomic<int> multi_token_q8_0{-1};  // MER_CUDA_MMA
std::atomic<int> fast_tiles{-1};        // MER_CUDA_MMA_TILED
std::atomic<int> kquant_tiles{-1};      // MER_CUDA_MMA_KQUANT

// The value of `setting`; at the first read, parse(the variable `name`, nullptr where unset).
template <typename Parse>
int ReadSetting(std::atomic<int>& setting, const char* name, Parse parse) {
  int v = setting.load(std::memory_order_relaxed);
  if (v < 0) {
    v = parse(std::getenv(name));
    setting.store(v, std::memory_order_relaxed);
  }
  return v;
}

}  // namespace

MultiTokenQ8_0 MultiTokenQ8_0Kernels() {
  return static_cast<MultiTokenQ8_0>(ReadSetting(multi_token_q8_0, "MER_CUDA_MMA", [](const char* v) {
    const MultiTokenQ8_0 chosen = v == nullptr                  ? MultiTokenQ8_0::kAuto
                                  : std::strcmp(v, "0") == 0    ? MultiTokenQ8_0::kDp4a
                                  : std::strcmp(v, "1") == 0    ? MultiTokenQ8_0::kMmaExact
                                  : std::strcmp(v, "fast") == 0 ? MultiTokenQ8_0::kMmaFast
                                                                : MultiTokenQ8_0::kAuto;
    return static_cast<int>(chosen);
  }));
}

void SetMultiTokenQ8_0(MultiTokenQ8_0 kernels) {
  multi_token_q8_0.store(static_cast<int>(kernels), std::memory_order_relaxed);
}

int MmaFastTiles() {
  static const int tiles = [] {
    const char* v = std::getenv("MER_CUDA_MMA_TILES");
    const int t = v != nullptr ? std::atoi(v) : 0;
    return t == 2 || t == 4 || t == 8 ? t : kMmaFastTilesDefault;
  }();
  return tiles;
}

FastTiles FastTilesChoice() {
  return static_cast<FastTiles>(ReadSetting(fast_tiles, "MER_CUDA_MMA_TILED", [](const char* v) {
    const FastTiles chosen = v == nullptr                 ? FastTiles::kByShape
                             : std::strcmp(v, "0") == 0   ? FastTiles::kOff
                             : std::strcmp(v, "all") == 0 ? FastTiles::kAlways
                                                          : FastTiles::kByShape;
    return static_cast<int>(chosen);
  }));
}

void SetFastTiles(FastTiles tiles) { fast_tiles.store(static_cast<int>(tiles), std::memory_order_relaxed); }

bool KQuantTilesEnabled() {
  return ReadSetting(kquant_tiles, "MER_CUDA_MMA_KQUANT",
                     [](const char* v) { return v != nullptr && std::strcmp(v, "1") == 0 ? 1 : 0; }) == 1;
}

void SetKQuantTiles(bool enabled) { kquant_tiles.store(enabled ? 1 : 0, std::memory_order_relaxed); }

void LaunchMatvec(const MatvecOutput* outputs, int n_outputs, const DevAct& act, int n_tokens, cudaStream_t stream) {
  if (n_outputs < 1 || n_outputs > kMaxOutputs) {
    std::fprintf(stderr, "matvec: %d outputs (1 to %d)\n", n_outputs, kMaxOutputs);
    std::abort();
  }
  MatvecArgs args{};
  args.n_outputs = n_outputs;
  args.act = act;
  args.n_tokens = n_tokens;
  args.row_begin[0] = 0;
  for (int i = 0; i < n_outputs; ++i) {
    args.o[i] = outputs[i];
    // Each matrix's rows start on a group's first row, so a group never spans two matrices.
    args.row_begin[i + 1] = args.row_begin[i] + (outputs[i].w.rows + kRows - 1) / kRows * kRows;
  }
  const int64_t total = args.row_begin[n_outputs];
  int64_t weight_bytes = 0;
  for (int i = 0; i < n_outputs; ++i)
    weight_bytes += outputs[i].w.rows * ActRowBytes(outputs[i].w.type, outputs[i].w.cols);
  args.prefetch_l2 = weight_bytes <= kL2PrefetchMaxBytes;
  if (BlockElemsOf(outputs[0].w.type) != 0) {  // the K-quant and table families (kquant_dot.cuh)
    LaunchMatvecKQuant(outputs, n_outputs, act, n_tokens, stream);
    return;
  }
  switch (outputs[0].w.type) {
    case kDevF32:
      Launch<kDevF32>(args, total, stream);
      break;
    case kDevF16:
      Launch<kDevF16>(args, total, stream);
      break;
    case kDevBF16:
      Launch<kDevBF16>(args, total, stream);
      break;
    case kDevQ8_0:
      Launch<kDevQ8_0>(args, total, stream);
      break;
    default:
      std::fprintf(stderr, "matvec: unsupported type %d\n", outputs[0].w.type);
      std::abort();
  }
}

}  // namespace mer::cuda
