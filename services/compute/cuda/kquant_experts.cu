#include "services/compute/cuda/kquant_experts.cuh"

#include <cstdio>
#include <cstdlib>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/expert_group.cuh"
#include "services/compute/cuda/ggml_math.cuh"
#include "services/compute/cuda/kquant_dot.cuh"
#include "services/compute/cuda/mma_kquant_tiles.cuh"
#include "services/compute/cuda/mma_tile_kernels.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kWarps = kExpertWarps;
constexpr int kGroupsPerBlock = kWarps * (32 / kKQuantGroup);

// Row r of gate and up per lane group (gate r, up r) over the group's pairs, NT at a time, then
// SwiGLU into h.
template <int kType, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    KQuantGateUpKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h) {
  WaitForPredecessor();
  AllowDependents();  // after the wait, as GateUpKernel: the down kernel may read the routing early
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const int lane = threadIdx.x % 32;
  const int64_t r = GridLaneGroup<kKQuantGroup>();
  const DevMatrix gate{kType, a.n_ff, a.n_embd, base};
  const DevMatrix up{kType, a.n_ff, a.n_embd, base + a.up_offset};
  const bool active = r < a.n_ff;  // inactive groups still join the warp's shuffles
  const KQuantRowRef rows[2] = {active ? BlockRow<kType>(gate, r) : KQuantRowRef{},
                                active ? BlockRow<kType>(up, r) : KQuantRowRef{}};
  for (int g = 0; g < n_pairs; g += NT) {
    int pair[NT];
    float acc[2][NT];
    PairRunBlockDots<kType>(rows, a.n_embd, pairs, g, n_pairs, a.k, act, pair, acc);
    if (lane % kKQuantGroup != 0 || !active) continue;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (pair[t] < 0) continue;
      h[int64_t(pair[t]) * a.n_ff + r] = SwiGlu(acc[0][t], acc[1][t]);
    }
  }
}

// Rows 2 * group, +1 of down per lane group over the group's pairs, NT at a time.
template <int kType, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    KQuantDownKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* out) {
  AllowDependents();
  WaitForPredecessor();
  constexpr int R = 2;
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const int lane = threadIdx.x % 32;
  const int64_t r0 = GridLaneGroup<kKQuantGroup>() * R;
  const DevMatrix down{kType, a.n_embd, a.n_ff, base + a.down_offset};
  KQuantRowRef rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = r0 + r < a.n_embd ? BlockRow<kType>(down, r0 + r) : KQuantRowRef{};
  for (int g = 0; g < n_pairs; g += NT) {
    int pair[NT];
    float acc[R][NT];
    PairRunBlockDots<kType>(rows, a.n_ff, pairs, g, n_pairs, 1, act, pair, acc);
    if (lane % kKQuantGroup != 0) continue;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (pair[t] >= 0 && rows[r].m != nullptr) out[int64_t(pair[t]) * a.n_embd + r0 + r] = acc[r][t];
  }
}

template <int kType>
void LaunchGateUpT(const ExpertArgs& a, const DevAct& act, float* h, int max_pairs, cudaStream_t s) {
  const dim3 grid((a.n_ff + kGroupsPerBlock - 1) / kGroupsPerBlock, a.u_count);
  if (max_pairs <= 1)
    LaunchPdl(KQuantGateUpKernel<kType, 1>, grid, dim3(kWarps * 32), 0, s, a, act, h);
  else
    LaunchPdl(KQuantGateUpKernel<kType, 8>, grid, dim3(kWarps * 32), 0, s, a, act, h);
}

template <int kType>
void LaunchDownT(const ExpertArgs& a, const DevAct& act, float* out, int max_pairs, cudaStream_t s) {
  constexpr int kRowsPerBlock = kGroupsPerBlock * 2;
  const dim3 grid((a.n_embd + kRowsPerBlock - 1) / kRowsPerBlock, a.u_count);
  if (max_pairs <= 1)
    LaunchPdl(KQuantDownKernel<kType, 1>, grid, dim3(kWarps * 32), 0, s, a, act, out);
  else
    LaunchPdl(KQuantDownKernel<kType, 8>, grid, dim3(kWarps * 32), 0, s, a, act, out);
}

void CheckArgs(const char* what, int type, int64_t cols, const DevAct& act) {
  const int block = BlockElemsOf(type);
  if (block == 0 || cols % block != 0 || act.type != BlockActTypeOf(type)) {
    std::fprintf(stderr, "experts (k-quant) %s: type %d, %lld cols, activation type %d\n", what, type,
                 static_cast<long long>(cols), act.type);
    std::abort();
  }
}

// Tokens per tile where the K-quant tiles (mma_kquant_tiles.cuh) take these products of a pass
// over n pairs per expert at most (cols: the activations' columns), else 0: KQuantTileTokens, by
// the pass's pairs per expert on average, as the Q8_0 tiles (moe_experts.cu).
int ExpertKQuantTileTokens(int type, int64_t cols, const DevAct& act, const ExpertArgs& a, int n) {
  return n > 1 ? KQuantTileTokens(type, cols, act.stride, MeanExpertTokens(a, n)) : 0;
}

}  // namespace

void LaunchExpertGateUpKQuant(const ExpertArgs& a, const DevAct& x_act, float* h, int max_group_pairs,
                              cudaStream_t stream) {
  CheckArgs("gate/up", a.type, a.n_embd, x_act);
  if (a.u_count <= 0) return;
  if (const int tokens = ExpertKQuantTileTokens(a.type, a.n_embd, x_act, a, max_group_pairs); tokens > 0) {
    WithKQuantTiles(a.type, tokens, [&](auto tiles) { LaunchGateUpTiled<decltype(tiles)>(a, x_act, h, stream); });
    return;
  }
  switch (a.type) {
    case kDevQ2_K:
      LaunchGateUpT<kDevQ2_K>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ3_K:
      LaunchGateUpT<kDevQ3_K>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ4_K:
      LaunchGateUpT<kDevQ4_K>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ5_K:
      LaunchGateUpT<kDevQ5_K>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ6_K:
      LaunchGateUpT<kDevQ6_K>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevIQ4_XS:
      LaunchGateUpT<kDevIQ4_XS>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevIQ2_XS:
      LaunchGateUpT<kDevIQ2_XS>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevIQ3_XXS:
      LaunchGateUpT<kDevIQ3_XXS>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevIQ3_S:
      LaunchGateUpT<kDevIQ3_S>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevIQ2_S:
      LaunchGateUpT<kDevIQ2_S>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevIQ1_S:
      LaunchGateUpT<kDevIQ1_S>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ4_0:
      LaunchGateUpT<kDevQ4_0>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevIQ4_NL:
      LaunchGateUpT<kDevIQ4_NL>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ5_0:
      LaunchGateUpT<kDevQ5_0>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ4_1:
      LaunchGateUpT<kDevQ4_1>(a, x_act, h, max_group_pairs, stream);
      break;
    case kDevQ5_1:
      LaunchGateUpT<kDevQ5_1>(a, x_act, h, max_group_pairs, stream);
      break;
    default:
      LaunchGateUpT<kDevIQ2_XXS>(a, x_act, h, max_group_pairs, stream);
      break;
  }
}

void LaunchExpertDownKQuant(const ExpertArgs& a, const DevAct& h_act, float* out, int max_group_pairs,
                            cudaStream_t stream) {
  CheckArgs("down", a.down_type, a.n_ff, h_act);
  if (a.u_count <= 0) return;
  if (const int tokens = ExpertKQuantTileTokens(a.down_type, a.n_ff, h_act, a, max_group_pairs); tokens > 0) {
    WithKQuantTiles(a.down_type, tokens, [&](auto tiles) { LaunchDownTiled<decltype(tiles)>(a, h_act, out, stream); });
    return;
  }
  switch (a.down_type) {
    case kDevQ2_K:
      LaunchDownT<kDevQ2_K>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ3_K:
      LaunchDownT<kDevQ3_K>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ4_K:
      LaunchDownT<kDevQ4_K>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ5_K:
      LaunchDownT<kDevQ5_K>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ6_K:
      LaunchDownT<kDevQ6_K>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevIQ4_XS:
      LaunchDownT<kDevIQ4_XS>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevIQ2_XS:
      LaunchDownT<kDevIQ2_XS>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevIQ3_XXS:
      LaunchDownT<kDevIQ3_XXS>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevIQ3_S:
      LaunchDownT<kDevIQ3_S>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevIQ2_S:
      LaunchDownT<kDevIQ2_S>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevIQ1_S:
      LaunchDownT<kDevIQ1_S>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ4_0:
      LaunchDownT<kDevQ4_0>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevIQ4_NL:
      LaunchDownT<kDevIQ4_NL>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ5_0:
      LaunchDownT<kDevQ5_0>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ4_1:
      LaunchDownT<kDevQ4_1>(a, h_act, out, max_group_pairs, stream);
      break;
    case kDevQ5_1:
      LaunchDownT<kDevQ5_1>(a, h_act, out, max_group_pairs, stream);
      break;
    default:
      LaunchDownT<kDevIQ2_XXS>(a, h_act, out, max_group_pairs, stream);
      break;
  }
}

}  // namespace mer::cuda
