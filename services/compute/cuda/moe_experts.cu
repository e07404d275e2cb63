#include "services/compute/cuda/moe_experts.cuh"

#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/expert_group.cuh"
#include "services/compute/cuda/ggml_math.cuh"
#include "services/compute/cuda/kquant_dot.cuh"
#include "services/compute/cuda/kquant_experts.cuh"
#include "services/compute/cuda/matvec.cuh"
#include "services/compute/cuda/mma_q8_0.cuh"
#include "services/compute/cuda/mma_q8_0_tiles.cuh"
#include "services/compute/cuda/mma_tile_kernels.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/staged_dots.cuh"
#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {
namespace {

constexpr int kWarps = kExpertWarps;

// Bytes of f32 block scales before the converted row in DownFromF32Kernel's shared memory (a
// multiple of 16, so the row's 16-byte loads stay aligned).
__host__ __device__ inline int64_t DownActScaleBytes(int64_t n_ff) { return (n_ff / 32 * 4 + 15) / 16 * 16; }

// Gate/up: each lane group takes row r of gate and of up of the block's expert (GroupExpert). Its
// row r (*active: r < n_ff), both rows and the group's pairs; false when the block has no group.
// Inactive lane groups still join the warp's shuffles.
template <int kType>
__device__ inline bool GateUpGroupRows(const ExpertArgs& a, int64_t* r, bool* active, RowRef (&rows)[2], int* n_pairs,
                                       const int32_t** pairs) {
  const uint8_t* base = GroupExpert(a, n_pairs, pairs);
  if (base == nullptr) return false;
  *r = GridLaneGroup<kGroup<kType>>();
  const DevMatrix gate{kType, a.n_ff, a.n_embd, base};
  const DevMatrix up{kType, a.n_ff, a.n_embd, base + a.up_offset};
  *active = *r < a.n_ff;
  rows[0] = *active ? MatrixRow<kType>(gate, *r) : RowRef{};
  rows[1] = *active ? MatrixRow<kType>(up, *r) : RowRef{};
  return true;
}

// Rows r of gate and up (2 rows per lane group: gate r, up r) over the group's pairs, NT at a time.
// At least 3 blocks per SM (<= 170 registers): a decode layer's 384 blocks on the 30B geometry
// then fit in one wave. stage_act: the pairs' token rows in shared memory (StageActRows).
template <int kType, int NT>
__global__ void __launch_bounds__(kWarps * 32, 3)
    GateUpKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h, bool stage_act) {
  // Dependents start only once every block is past the wait, that is once the routing (this
  // kernel's predecessor) has completed: the down kernel reads the routing's choices and loads its
  // weights before it waits for this kernel.
  WaitForPredecessor();
  AllowDependents();
  constexpr int G = kGroup<kType>;
  const int lane = threadIdx.x % 32;
  int64_t r;
  bool active;
  RowRef rows[2];
  int n_pairs;
  const int32_t* pairs;
  if (!GateUpGroupRows<kType>(a, &r, &active, rows, &n_pairs, &pairs)) return;
  for (int g = 0; g < n_pairs; g += NT) {
    int pair[NT];
    float acc[2][NT];
    PairRunDots<kType>(rows, a.n_embd, pairs, g, n_pairs, a.k, act, stage_act, pair, acc);
    if (lane % G != 0 || !active) continue;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (pair[t] < 0) continue;
      h[int64_t(pair[t]) * a.n_ff + r] = SwiGlu(acc[0][t], acc[1][t]);
    }
  }
}

// Decode (one pair per expert), Q8_0: a lane group per row, gate (even groups) or up (odd), the
// up sum shuffled to the gate's lane for SwiGLU; the same sums bit for bit (a row's chain does not
// depend on the rows beside it). GateUpKernel's 2 rows per group give the 30B geometry's 8
// experts 1,536 warps, ~12 per SM at 166 registers, which wait on their shared-memory activations
// with nothing else to issue. Here 3,072 warps at 62 registers (64 now; 4 runs of 4 blocks in
// flight per lane, 6 or more blocks per SM) fit in one wave: decode 296.6-297.7 against 284.1-284.7 tokens/s
// on the H200, 30B geometry. 8 runs in flight: at 80 registers (spilling) 295.1-295.2,
// at 114 (1.5 waves) 282.8-283.4; 16 runs at 164 registers (2 waves) 284.7-285.5.
constexpr int kGateUpRowRuns = 4;
__global__ void __launch_bounds__(kWarps * 32, 6)
    GateUpRowKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h) {
  WaitForPredecessor();
  AllowDependents();  // after the wait, as GateUpKernel
  constexpr int G = kGroup<kDevQ8_0>;
  const int lane = threadIdx.x % 32;
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const int64_t lane_group = GridLaneGroup<G>();
  const int64_t r = lane_group / 2;
  const bool active = r < a.n_ff;
  const DevMatrix m{kDevQ8_0, a.n_ff, a.n_embd, base + (lane_group % 2 == 1 ? a.up_offset : 0)};
  const RowRef rows[1] = {active ? MatrixRow<kDevQ8_0>(m, r) : RowRef{}};
  const int64_t rb = ActRowBytes(act.type, act.stride);
  extern __shared__ uint4 gate_up_act[];
  for (int g = 0; g < n_pairs; ++g) {
    const int pair = __ldcg(pairs + g);
    const uint8_t* act_rows[1] = {act.data + int64_t(pair / a.k) * rb};
    const float* act_scales[1] = {act.scales + int64_t(pair / a.k) * (act.stride / 32)};
    if (g > 0) __syncthreads();
    StageActRows<kDevQ8_0, 1>(gate_up_act, act_rows, act_scales, a.n_embd);
    float acc[1][1];
    GroupDots<kDevQ8_0, 1, 1, kGateUpRowRuns>(rows, a.n_embd, act_rows, act_scales, acc);
    const float up = __shfl_down_sync(0xffffffffu, acc[0][0], G);
    if (lane % (2 * G) == 0 && active) h[int64_t(pair) * a.n_ff + r] = SwiGlu(acc[0][0], up);
  }
}

// Down: each lane group takes kDownRows consecutive rows of the block's expert (group u =
// u_begin + blockIdx.y). Its rows and the group's pairs; false when the block has no group.
constexpr int kDownRows = 2;
// Runs of 4 blocks per row that the decode down kernel loads before its wait: 6 (n_ff <= 768,
// the 30B geometry) or 8 (n_ff <= 1,024), and the blocks per SM that its registers allow.
constexpr int kDownPreloadRunsSmall = 6, kDownPreloadRunsLarge = 8;
constexpr int DownBlocksPerSm(int runs) { return runs <= kDownPreloadRunsSmall ? 4 : 3; }

template <int kType>
__device__ inline bool DownGroupRows(const ExpertArgs& a, int64_t* r0, RowRef (&rows)[kDownRows], int* n_pairs,
                                     const int32_t** pairs) {
  const uint8_t* base = GroupExpert(a, n_pairs, pairs);
  if (base == nullptr) return false;
  *r0 = GridLaneGroup<kGroup<kType>>() * kDownRows;
  const DevMatrix down{kType, a.n_embd, a.n_ff, base + a.down_offset};
#pragma unroll
  for (int r = 0; r < kDownRows; ++r) rows[r] = *r0 + r < a.n_embd ? MatrixRow<kType>(down, *r0 + r) : RowRef{};
  return true;
}

template <int kType>
dim3 DownGrid(const ExpertArgs& a) {
  constexpr int kRowsPerBlock = kWarps * (32 / kGroup<kType>)*kDownRows;
  return dim3((a.n_embd + kRowsPerBlock - 1) / kRowsPerBlock, a.u_count);
}

template <int kType, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    DownKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* out, bool stage_act) {
  AllowDependents();
  WaitForPredecessor();
  constexpr int R = kDownRows, G = kGroup<kType>;
  const int lane = threadIdx.x % 32;
  int64_t r0;
  RowRef rows[R];
  int n_pairs;
  const int32_t* pairs;
  if (!DownGroupRows<kType>(a, &r0, rows, &n_pairs, &pairs)) return;
  for (int g = 0; g < n_pairs; g += NT) {
    int pair[NT];
    float acc[R][NT];
    PairRunDots<kType>(rows, a.n_ff, pairs, g, n_pairs, 1, act, stage_act, pair, acc);
    if (lane % G != 0) continue;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (pair[t] >= 0 && rows[r].q != nullptr) out[int64_t(pair[t]) * a.n_embd + r0 + r] = acc[r][t];
  }
}

// One pair per expert (decode): the SwiGLU output's conversion to the down matrix's dot type,
// done by each block into shared memory (StoreAct, the same bytes as LaunchQuantize), then the
// down rows as DownKernel<kType, 1>. One launch and one hand-off less per layer. Q8_0 rows of at
// most 1,024 columns are loaded into registers before the wait (GroupQ8_0Preload), so they arrive
// while gate/up still runs (decode 224 against 214 tokens/s on the H200, 30B geometry).
template <int kType, int kPreloadRuns>
__global__ void __launch_bounds__(kWarps * 32, DownBlocksPerSm(kPreloadRuns))
    DownFromF32Kernel(const __grid_constant__ ExpertArgs a, const float* h, float* out) {
  extern __shared__ float4 act_smem[];  // Q8_0 scales (f32), then the row, 16-byte aligned
  AllowDependents();
  constexpr int R = kDownRows, G = kGroup<kType>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t r0;
  RowRef rows[R];
  int n_pairs;
  const int32_t* pairs;
  // The routing's choices are final once the gate/up kernel lets this one start (it allows its
  // dependents only after its own wait), so the weights are loaded while gate/up still runs.
  if (!DownGroupRows<kType>(a, &r0, rows, &n_pairs, &pairs) || n_pairs == 0) return;
  const int pair = __ldcg(pairs);
  using Preload = GroupQ8_0Preload<R, kPreloadRuns>;
  const int64_t nb = a.n_ff / 32;
  const bool preload = kType == kDevQ8_0 && Preload::Fits(nb);
  Preload w;
  if (preload) w.Load(rows, nb);
  WaitForPredecessor();
  float* scales = reinterpret_cast<float*>(act_smem);
  uint8_t* row = reinterpret_cast<uint8_t*>(act_smem) + DownActScaleBytes(a.n_ff);
  const DevAct act{kType, a.n_ff, row, scales};  // the dot type of F32/F16/BF16/Q8_0 rows is their own
  // Warp w converts the 32-element blocks w, w + kWarps, ... (StoreAct: a block per warp call),
  // kConvert of them loaded at once (one L2 round trip, not one per block).
  constexpr int kConvert = 8;
  const float* hp = h + int64_t(pair) * a.n_ff;
  for (int64_t c0 = int64_t(warp) * 32; c0 < a.n_ff; c0 += kConvert * kWarps * 32) {
    float v[kConvert];
#pragma unroll
    for (int j = 0; j < kConvert; ++j) {
      const int64_t i = c0 + j * kWarps * 32;
      v[j] = i < a.n_ff ? hp[i + lane] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kConvert; ++j) {
      const int64_t i = c0 + j * kWarps * 32;  // uniform per warp
      if (i < a.n_ff) StoreAct(act, 0, i + lane, v[j]);
    }
  }
  __syncthreads();
  float acc[R][1];
  if (preload) {
    float acc_r[R];
    w.Dot(nb, row, scales, acc_r);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r][0] = acc_r[r];
  } else {
    const uint8_t* const act_rows[1] = {row};
    const float* const act_scales[1] = {kType == kDevQ8_0 ? scales : nullptr};
    GroupDots<kType, R, 1, 8>(rows, a.n_ff, act_rows, act_scales, acc);
  }
  if (lane % G != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (rows[r].q != nullptr) out[int64_t(pair) * a.n_embd + r0 + r] = acc[r][0];
}

// Multi-token passes over Q8_0 experts (staged_dots.cuh). Gate/up stages 2 pairs at a time: its
// 70 KB of rows and 4.6 KB of activations per block leave room for 3 blocks per SM, which beat 8
// pairs at 2 blocks per SM on the H200 (30B geometry, 31-token prompt: 2,019-2,020 against
// 1,942-1,950 tokens/s), more warps to hide shared-memory latency outweighing a few more
// instructions per dp4a. Down stages 8 (28 KB of rows and 7 KB of activations per block).
constexpr int kGateUpStagedNT = 2, kDownStagedNT = 8;

__global__ void __launch_bounds__(kWarps * 32)
    GateUpStagedKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h) {
  extern __shared__ uint4 staged[];
  WaitForPredecessor();
  AllowDependents();  // after the wait, as GateUpKernel
  int64_t r;
  bool active;
  RowRef rows[2];
  int n_pairs;
  const int32_t* pairs;
  if (!GateUpGroupRows<kDevQ8_0>(a, &r, &active, rows, &n_pairs, &pairs)) return;
  const int64_t rb = ActRowBytes(act.type, act.stride);
  StagedDots<kGateUpStagedNT>(
      staged, rows, a.n_embd, [] {}, n_pairs, [&](int i) { return __ldcg(pairs + i); },
      [&](int pair, const uint8_t** q, const float** s) {
        const int64_t tok = pair / a.k;
        *q = act.data + tok * rb;
        *s = act.scales + tok * (act.stride / 32);
      },
      [&](int pair, const float(&sum)[2]) {
        if (active) h[int64_t(pair) * a.n_ff + r] = SwiGlu(sum[0], sum[1]);
      });
}

// The routing is final once this kernel starts (as for DownFromF32Kernel: gate/up lets its
// dependents start only after its own wait), so the block stages its rows while gate/up and the
// conversion of h still run, and waits only before reading h.
__global__ void __launch_bounds__(kWarps * 32)
    DownStagedKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* out) {
  extern __shared__ uint4 staged[];
  AllowDependents();
  int64_t r0;
  RowRef rows[kDownRows];
  int n_pairs;
  const int32_t* pairs;
  if (!DownGroupRows<kDevQ8_0>(a, &r0, rows, &n_pairs, &pairs)) return;
  const int64_t rb = ActRowBytes(act.type, act.stride);
  StagedDots<kDownStagedNT>(
      staged, rows, a.n_ff, [] { WaitForPredecessor(); }, n_pairs, [&](int i) { return __ldcg(pairs + i); },
      [&](int pair, const uint8_t** q, const float** s) {
        *q = act.data + int64_t(pair) * rb;
        *s = act.scales + int64_t(pair) * (act.stride / 32);
      },
      [&](int pair, const float(&sum)[2]) {
#pragma unroll
        for (int m = 0; m < kDownRows; ++m)
          if (rows[m].q != nullptr) out[int64_t(pair) * a.n_embd + r0 + m] = sum[m];
      });
}

// Multi-token passes over Q8_0 experts on the tensor cores (mma_q8_0.cuh). Gate/up: a warp's 16
// mma rows are 8 rows of gate and the same 8 of up, so that one thread holds both sums of each
// SwiGLU; down: 16 rows. The block's 4 warps share the expert's pairs, up to 8 kTiles staged at a
// time (2 tiles in the exact form, MmaTilesFor in the fast one); a chunk of at most 8 computes one
// tile. ptxas gives the exact kernels ~250 registers (it keeps the 32 mmas of a run of 4 blocks in
// flight), so 2 blocks per SM; the fast ones ~140 at 2 tiles.
constexpr int kGateUpMmaRows = kWarps * kMmaRows / 2, kDownMmaRows = kWarps * kMmaRows;  // per block

template <bool kExact, int kTiles>
__global__ void __launch_bounds__(kWarps * 32, 2)
    GateUpMmaKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h) {
  constexpr int kSlots = kTiles * kMmaTokens;
  extern __shared__ uint4 mma_smem[];
  WaitForPredecessor();
  AllowDependents();  // after the wait, as GateUpKernel
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t r = int64_t(blockIdx.x) * kGateUpMmaRows + warp * (kMmaRows / 2) + gid;
  const bool active = r < a.n_ff;
  const DevMatrix gate{kDevQ8_0, a.n_ff, a.n_embd, base};
  const DevMatrix up{kDevQ8_0, a.n_ff, a.n_embd, base + a.up_offset};
  const RowRef lo = active ? MatrixRow<kDevQ8_0>(gate, r) : RowRef{};
  const RowRef hi = active ? MatrixRow<kDevQ8_0>(up, r) : RowRef{};
  PrefetchRowToL2<kDevQ8_0, 4>(lo, a.n_embd);  // the 4 lanes of a row (tig) share its lines
  PrefetchRowToL2<kDevQ8_0, 4>(hi, a.n_embd);
  const int64_t rb = ActRowBytes(act.type, act.stride);
  uint8_t* smem = reinterpret_cast<uint8_t*>(mma_smem);
  for (int p0 = 0; p0 < n_pairs; p0 += kSlots) {
    const int n = min(kSlots, n_pairs - p0);
    if (p0 > 0) __syncthreads();  // every warp is done with the previous pairs
    MmaStageAct(smem, a.n_embd, kSlots, n, [&](int i, const uint8_t** q, const float** s) {
      const int64_t tok = __ldcg(pairs + p0 + i) / a.k;
      *q = act.data + tok * rb;
      *s = act.scales + tok * (act.stride / 32);
    });
    __syncthreads();
    float sums[kTiles][4];
    MmaQ8_0Dots<kTiles, kExact>(lo, hi, a.n_embd, smem, kSlots, (n + kMmaTokens - 1) / kMmaTokens, sums);
    if (!active) continue;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int c = 0; c < 2; ++c) {  // token 2 tig + c: gate in C element c, up in c + 2
        const int i = t * kMmaTokens + 2 * tig + c;
        if (i < n) h[int64_t(__ldcg(pairs + p0 + i)) * a.n_ff + r] = SwiGlu(sums[t][c], sums[t][c + 2]);
      }
  }
}

// The routing is final once this kernel starts (as for DownStagedKernel), so the block finds its
// expert before the wait, and waits only before reading h.
template <bool kExact, int kTiles>
__global__ void __launch_bounds__(kWarps * 32, 2)
    DownMmaKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* out) {
  constexpr int kSlots = kTiles * kMmaTokens;
  extern __shared__ uint4 mma_smem[];
  AllowDependents();
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t r = int64_t(blockIdx.x) * kDownMmaRows + warp * kMmaRows + gid;  // and r + 8
  const DevMatrix down{kDevQ8_0, a.n_embd, a.n_ff, base + a.down_offset};
  const RowRef lo = r < a.n_embd ? MatrixRow<kDevQ8_0>(down, r) : RowRef{};
  const RowRef hi = r + 8 < a.n_embd ? MatrixRow<kDevQ8_0>(down, r + 8) : RowRef{};
  PrefetchRowToL2<kDevQ8_0, 4>(lo, a.n_ff);  // while gate/up still runs
  PrefetchRowToL2<kDevQ8_0, 4>(hi, a.n_ff);
  const int64_t rb = ActRowBytes(act.type, act.stride);
  uint8_t* smem = reinterpret_cast<uint8_t*>(mma_smem);
  WaitForPredecessor();
  for (int p0 = 0; p0 < n_pairs; p0 += kSlots) {
    const int n = min(kSlots, n_pairs - p0);
    if (p0 > 0) __syncthreads();
    MmaStageAct(smem, a.n_ff, kSlots, n, [&](int i, const uint8_t** q, const float** s) {
      const int64_t pair = __ldcg(pairs + p0 + i);
      *q = act.data + pair * rb;
      *s = act.scales + pair * (act.stride / 32);
    });
    __syncthreads();
    float sums[kTiles][4];
    MmaQ8_0Dots<kTiles, kExact>(lo, hi, a.n_ff, smem, kSlots, (n + kMmaTokens - 1) / kMmaTokens, sums);
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) {  // C element c: row r (+ 8 for c >= 2), pair 2 tig + c % 2
        const int i = t * kMmaTokens + 2 * tig + c % 2;
        const RowRef& row = c >= 2 ? hi : lo;
        if (i < n && row.q != nullptr)
          out[int64_t(__ldcg(pairs + p0 + i)) * a.n_embd + r + (c >= 2 ? 8 : 0)] = sums[t][c];
      }
  }
}

// The same products in the fast form's shared-memory tiles (mma_tile_kernels.cuh) where
// ExpertTileTokens says so, kBN by the pass's pairs per expert.

// Tokens per tile where the tiled kernels take these Q8_0 products of a step of n tokens (cols:
// the activations' columns), else 0: the fast form with its tiles (FastTiles), rows and
// activations that fit them; the tile's tokens by the pass's pairs per expert on average.
int ExpertTileTokens(int type, int64_t cols, const DevAct& act, const ExpertArgs& a, int n) {
  if (MultiTokenQ8_0Kernels() != MultiTokenQ8_0::kMmaFast || FastTilesChoice() == FastTiles::kOff ||
      !MmaTilesFit(type, cols, act.stride))
    return 0;
  return MmaTileTokens(MeanExpertTokens(a, n));
}

// The mma kernels' tiles per pass for these Q8_0 products of a step of n tokens (cols: the
// activations' columns), or 0 where the dp4a kernels take them: MmaTilesTaking's, and under kAuto
// only where the pass's experts have kMmaAutoMinPairs pairs each on average.
int ExpertMmaTiles(int type, int64_t cols, const ExpertArgs& a, int n) {
  const bool enough_pairs =
      MultiTokenQ8_0Kernels() != MultiTokenQ8_0::kAuto || int64_t(n) * a.k >= int64_t(kMmaAutoMinPairs) * a.u_count;
  return enough_pairs ? MmaTilesTaking(type, cols) : 0;
}

template <int kType>
void LaunchGateUpT(const ExpertArgs& a, const DevAct& act, float* h, int max_pairs, cudaStream_t s) {
  constexpr int kRowsPerBlock = kWarps * (32 / kGroup<kType>);
  const dim3 grid((a.n_ff + kRowsPerBlock - 1) / kRowsPerBlock, a.u_count);
  if (max_pairs <= 1) {
    const int64_t smem = StagedActSmem<kType>(1, a.n_embd);
    if (kType == kDevQ8_0 && smem > 0)  // a lane group per row: twice the blocks
      LaunchPdl(GateUpRowKernel, dim3(2 * grid.x, grid.y), dim3(kWarps * 32), smem, s, a, act, h);
    else
      LaunchPdl(GateUpKernel<kType, 1>, grid, dim3(kWarps * 32), smem, s, a, act, h, smem > 0);
  } else if (const int tokens = ExpertTileTokens(kType, a.n_embd, act, a, max_pairs); tokens > 0) {
    WithMmaTileTokens(tokens, [&](auto kBN) { LaunchGateUpTiled<Q8_0Tiles<decltype(kBN)::value>>(a, act, h, s); });
  } else if (const int mma_tiles = ExpertMmaTiles(kType, a.n_embd, a, max_pairs); mma_tiles > 0) {
    WithMmaForm(MultiTokenQ8_0Exact(), mma_tiles, [&](auto kExact, auto kTiles) {
      const auto kernel = GateUpMmaKernel<decltype(kExact)::value, decltype(kTiles)::value>;
      static const bool limit_set = (SetStagedSmemLimit(kernel), true);  // one per instance
      (void)limit_set;
      LaunchPdl(kernel, dim3((a.n_ff + kGateUpMmaRows - 1) / kGateUpMmaRows, a.u_count), dim3(kWarps * 32),
                MmaActSmemBytes(a.n_embd, decltype(kTiles)::value * kMmaTokens), s, a, act, h);
    });
  } else if (StagedFits(kType, a.n_embd, kWarps * 32, kGateUpStagedNT)) {
    static const bool limit_set = (SetStagedSmemLimit(GateUpStagedKernel), true);
    (void)limit_set;
    LaunchPdl(GateUpStagedKernel, grid, dim3(kWarps * 32), StagedSmemBytes(a.n_embd, kWarps * 32, kGateUpStagedNT), s,
              a, act, h);
  } else {
    const int64_t smem = StagedActSmem<kType>(8, a.n_embd);
    LaunchPdl(GateUpKernel<kType, 8>, grid, dim3(kWarps * 32), smem, s, a, act, h, smem > 0);
  }
}

template <int kType>
void LaunchDownT(const ExpertArgs& a, const DevAct& act, float* out, int max_pairs, cudaStream_t s) {
  const dim3 grid = DownGrid<kType>(a);
  if (const int tokens = max_pairs > 1 ? ExpertTileTokens(kType, a.n_ff, act, a, max_pairs) : 0; tokens > 0) {
    WithMmaTileTokens(tokens, [&](auto kBN) { LaunchDownTiled<Q8_0Tiles<decltype(kBN)::value>>(a, act, out, s); });
    return;
  }
  const int mma_tiles = max_pairs > 1 ? ExpertMmaTiles(kType, a.n_ff, a, max_pairs) : 0;
  if (mma_tiles > 0) {
    WithMmaForm(MultiTokenQ8_0Exact(), mma_tiles, [&](auto kExact, auto kTiles) {
      const auto kernel = DownMmaKernel<decltype(kExact)::value, decltype(kTiles)::value>;
      static const bool limit_set = (SetStagedSmemLimit(kernel), true);  // one per instance
      (void)limit_set;
      LaunchPdl(kernel, dim3((a.n_embd + kDownMmaRows - 1) / kDownMmaRows, a.u_count), dim3(kWarps * 32),
                MmaActSmemBytes(a.n_ff, decltype(kTiles)::value * kMmaTokens), s, a, act, out);
    });
    return;
  }
  if (max_pairs > 1 && StagedFits(kType, a.n_ff, kWarps * 32, kDownStagedNT)) {
    static const bool limit_set = (SetStagedSmemLimit(DownStagedKernel), true);
    (void)limit_set;
    LaunchPdl(DownStagedKernel, grid, dim3(kWarps * 32), StagedSmemBytes(a.n_ff, kWarps * 32, kDownStagedNT), s, a, act,
              out);
    return;
  }
  const int nt = max_pairs <= 1 ? 1 : 8;
  const int64_t smem = StagedActSmem<kType>(nt, a.n_ff);
  if (nt == 1)
    LaunchPdl(DownKernel<kType, 1>, grid, dim3(kWarps * 32), smem, s, a, act, out, smem > 0);
  else
    LaunchPdl(DownKernel<kType, 8>, grid, dim3(kWarps * 32), smem, s, a, act, out, smem > 0);
}

template <int kType>
void LaunchDownFromF32T(const ExpertArgs& a, const float* h, float* out, cudaStream_t s) {
  const size_t smem = DownActScaleBytes(a.n_ff) + ActRowBytes(kType, a.n_ff);
  // With 6 runs the kernel fits 4 blocks per SM, so that the 30B geometry's 512 blocks (8 experts x
  // 64) are one wave on 132 SMs: at 3 per SM the last quarter of them started only when the first
  // ones had finished, and could not load their rows while gate/up ran.
  auto* kernel = GroupQ8_0Preload<kDownRows, kDownPreloadRunsSmall>::Fits(a.n_ff / 32)
                     ? DownFromF32Kernel<kType, kDownPreloadRunsSmall>
                     : DownFromF32Kernel<kType, kDownPreloadRunsLarge>;
  LaunchPdl(kernel, DownGrid<kType>(a), dim3(kWarps * 32), smem, s, a, h, out);
}

// Calls launch(std::integral_constant<int, T>{}) for type T among F32, F16, BF16 and Q8_0, the
// types of this file's kernels; any other type is a caller's error (the engine checks types at
// creation).
template <typename Launch>
void WithExpertType(int type, const char* what, Launch launch) {
  switch (type) {
    case kDevF32:
      return launch(std::integral_constant<int, kDevF32>{});
    case kDevF16:
      return launch(std::integral_constant<int, kDevF16>{});
    case kDevBF16:
      return launch(std::integral_constant<int, kDevBF16>{});
    case kDevQ8_0:
      return launch(std::integral_constant<int, kDevQ8_0>{});
    default:
      std::fprintf(stderr, "experts: %s: unsupported type %d\n", what, type);
      std::abort();
  }
}

}  // namespace

bool ExpertDownConvertsInput(int down_type, int64_t n_ff) {
  // The dot type of F32/F16/BF16/Q8_0 rows is their own, which StoreAct writes.
  return StoreActWrites(down_type) && n_ff % 32 == 0 && DownActScaleBytes(n_ff) + n_ff * 4 <= 48 * 1024;
}

void LaunchExpertDownFromF32(const ExpertArgs& a, const float* h, float* out, cudaStream_t stream) {
  WithExpertType(a.down_type, "down from f32",
                 [&](auto type) { LaunchDownFromF32T<decltype(type)::value>(a, h, out, stream); });
}

void LaunchExpertGateUp(const ExpertArgs& a, const DevAct& x_act, float* h, int max_group_pairs, cudaStream_t stream) {
  if (a.up_type != a.type) {  // the kernels below read both with gate's type
    std::fprintf(stderr, "experts: gate/up: gate type %d, up type %d (LaunchExpertGateUpMixed)\n", a.type, a.up_type);
    std::abort();
  }
  if (BlockElemsOf(a.type) != 0) {  // the K-quant and table families (kquant_dot.cuh)
    LaunchExpertGateUpKQuant(a, x_act, h, max_group_pairs, stream);
    return;
  }
  WithExpertType(a.type, "gate/up",
                 [&](auto type) { LaunchGateUpT<decltype(type)::value>(a, x_act, h, max_group_pairs, stream); });
}

void LaunchExpertDown(const ExpertArgs& a, const DevAct& h_act, float* out, int max_group_pairs, cudaStream_t stream) {
  if (BlockElemsOf(a.down_type) != 0) {  // the K-quant and table families (kquant_dot.cuh)
    LaunchExpertDownKQuant(a, h_act, out, max_group_pairs, stream);
    return;
  }
  WithExpertType(a.down_type, "down",
                 [&](auto type) { LaunchDownT<decltype(type)::value>(a, h_act, out, max_group_pairs, stream); });
}

}  // namespace mer::cuda
