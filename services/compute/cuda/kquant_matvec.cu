#include "services/compute/cuda/kquant_matvec.cuh"

#include <cstdio>
#include <cstdlib>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/kquant_dot.cuh"
#include "services/compute/cuda/mma_kquant_tiles.cuh"
#include "services/compute/cuda/mma_tile_kernels.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kWarps = 4;                                    // warps per block
constexpr int kRowsPerBlock = kWarps * (32 / kKQuantGroup);  // one row per lane group
constexpr int kMaxOutputs = 3;

struct KQuantMatvecArgs {
  MatvecOutput o[kMaxOutputs];
  int64_t row_begin[kMaxOutputs + 1];  // concatenated row ranges
  int n_outputs;
  DevAct act;
  int n_tokens;
};

// Group (blockIdx.x * kWarps + warp) * 4 + lane / 8 takes one row of the concatenated matrices,
// tokens [blockIdx.y * NT, +NT).
template <int kType, int NT>
__global__ void __launch_bounds__(kWarps * 32) KQuantMatvecKernel(const __grid_constant__ KQuantMatvecArgs args) {
  AllowDependents();
  WaitForPredecessor();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t grow = (int64_t(blockIdx.x) * kWarps + warp) * (32 / kKQuantGroup) + lane / kKQuantGroup;
  int m = 0;
  while (m + 1 < args.n_outputs && grow >= args.row_begin[m + 1]) ++m;
  const MatvecOutput& o = args.o[m];
  const int64_t row = grow - args.row_begin[m];
  const bool active = grow < args.row_begin[args.n_outputs] && row < o.w.rows;
  const KQuantRowRef rows[1] = {active ? BlockRow<kType>(o.w, row) : KQuantRowRef{}};
  const int t0 = blockIdx.y * NT;
  KQuantActRef acts[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acts[t] = t0 + t < args.n_tokens ? BlockAct<kType>(args.act, t0 + t) : KQuantActRef{};
  float acc[1][NT];
  BlockGroupDots<kType, 1, NT, NT == 1 ? 4 : 2>(rows, args.o[0].w.cols / kBlockElems<kType>, acts, args.act.stride,
                                                acc);
  if (lane % kKQuantGroup != 0 || !active) return;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (acts[t].row == nullptr) continue;
    const int64_t i = int64_t(t0 + t) * o.out_stride + row;
    o.out[i] = o.residual != nullptr ? __fadd_rn(o.residual[i], acc[0][t]) : acc[0][t];
  }
}

// The K-quant tiles (mma_kquant_tiles.cuh) for these outputs; false where they do not take them:
// the fast form's choice (KQuantTileTokens) for the step's tokens (FastTilesTakeMatvec), as the
// Q8_0 tiles (matvec.cu).
bool LaunchKQuantTiled(const KQuantMatvecArgs& args, int64_t total_rows, cudaStream_t stream) {
  const int type = args.o[0].w.type;
  const int tokens = KQuantTileTokens(type, args.o[0].w.cols, args.act.stride, args.n_tokens);
  if (args.n_tokens < 2 || tokens == 0 || !FastTilesTakeMatvec(args.n_tokens)) return false;
  WithKQuantTiles(type, tokens, [&](auto tiles) { LaunchMatvecTiled<decltype(tiles)>(args, total_rows, stream); });
  return true;
}

template <int kType>
void Launch(const KQuantMatvecArgs& args, int64_t total_rows, cudaStream_t stream) {
  const unsigned bx = static_cast<unsigned>((total_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  if (args.n_tokens == 1) {
    LaunchPdl(KQuantMatvecKernel<kType, 1>, dim3(bx, 1), dim3(kWarps * 32), 0, stream, args);
  } else {
    constexpr int NT = 8;
    LaunchPdl(KQuantMatvecKernel<kType, NT>, dim3(bx, (args.n_tokens + NT - 1) / NT), dim3(kWarps * 32), 0, stream,
              args);
  }
}

}  // namespace

void LaunchMatvecKQuant(const MatvecOutput* outputs, int n_outputs, const DevAct& act, int n_tokens,
                        cudaStream_t stream) {
  const int type = n_outputs > 0 ? outputs[0].w.type : -1;
  const int block = BlockElemsOf(type);
  if (n_outputs < 1 || n_outputs > kMaxOutputs || block == 0 || act.type != BlockActTypeOf(type)) {
    std::fprintf(stderr, "matvec (k-quant): %d outputs, weight type %d, activation type %d\n", n_outputs,
                 n_outputs > 0 ? outputs[0].w.type : -1, act.type);
    std::abort();
  }
  KQuantMatvecArgs args{};
  args.n_outputs = n_outputs;
  args.act = act;
  args.n_tokens = n_tokens;
  args.row_begin[0] = 0;
  for (int i = 0; i < n_outputs; ++i) {
    if (outputs[i].w.type != outputs[0].w.type || outputs[i].w.cols != outputs[0].w.cols ||
        outputs[i].w.cols % block != 0) {
      std::fprintf(stderr, "matvec (k-quant): output %d is type %d x %lld cols, output 0 type %d x %lld\n", i,
                   outputs[i].w.type, static_cast<long long>(outputs[i].w.cols), outputs[0].w.type,
                   static_cast<long long>(outputs[0].w.cols));
      std::abort();
    }
    args.o[i] = outputs[i];
    args.row_begin[i + 1] = args.row_begin[i] + outputs[i].w.rows;
  }
  const int64_t total = args.row_begin[n_outputs];
  if (total == 0 || n_tokens == 0) return;
  if (LaunchKQuantTiled(args, total, stream)) return;
  switch (type) {
    case kDevQ2_K:
      Launch<kDevQ2_K>(args, total, stream);
      break;
    case kDevQ3_K:
      Launch<kDevQ3_K>(args, total, stream);
      break;
    case kDevQ4_K:
      Launch<kDevQ4_K>(args, total, stream);
      break;
    case kDevQ5_K:
      Launch<kDevQ5_K>(args, total, stream);
      break;
    case kDevQ6_K:
      Launch<kDevQ6_K>(args, total, stream);
      break;
    case kDevIQ4_XS:
      Launch<kDevIQ4_XS>(args, total, stream);
      break;
    case kDevIQ2_XS:
      Launch<kDevIQ2_XS>(args, total, stream);
      break;
    case kDevIQ3_XXS:
      Launch<kDevIQ3_XXS>(args, total, stream);
      break;
    case kDevIQ3_S:
      Launch<kDevIQ3_S>(args, total, stream);
      break;
    case kDevIQ2_S:
      Launch<kDevIQ2_S>(args, total, stream);
      break;
    case kDevIQ1_S:
      Launch<kDevIQ1_S>(args, total, stream);
      break;
    case kDevQ4_0:
      Launch<kDevQ4_0>(args, total, stream);
      break;
    case kDevIQ4_NL:
      Launch<kDevIQ4_NL>(args, total, stream);
      break;
    case kDevQ5_0:
      Launch<kDevQ5_0>(args, total, stream);
      break;
    case kDevQ4_1:
      Launch<kDevQ4_1>(args, total, stream);
      break;
    case kDevQ5_1:
      Launch<kDevQ5_1>(args, total, stream);
      break;
    default:
      Launch<kDevIQ2_XXS>(args, total, stream);
      break;
  }
}

}  // namespace mer::cuda
