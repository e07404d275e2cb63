#include "services/compute/cuda/expert_product.cuh"

#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "services/compute/cuda/expert_group.cuh"
#include "services/compute/cuda/ggml_math.cuh"
#include "services/compute/cuda/kquant_dot.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {
namespace {

constexpr int kWarps = kExpertWarps;
constexpr int kRows = 2;  // rows per lane group

// The float and Q8_0 types (warp_dot.cuh's GroupDots) against the block types of kquant_dot.cuh.
template <int kType>
inline constexpr bool kIsWarpDotType = kType == kDevF32 || kType == kDevF16 || kType == kDevBF16 || kType == kDevQ8_0;
template <int kType>
inline constexpr int kLanes = kIsWarpDotType<kType> ? kGroup<kType> : kKQuantGroup;  // per row

// Gate's launch (kUp false) stores its sums in h; up's (kUp true) reads gate's sum of the same
// element back and stores SwiGLU. The same lane writes an element in both launches.
template <bool kUp>
__device__ inline void Store(float* h, int64_t i, float sum) {
  h[i] = kUp ? SwiGlu(__ldcg(h + i), sum) : sum;  // through L2: gate's launch wrote it
}

// Rows r0, r0 + 1 of gate or up (kUp) of type kType per lane group against the token rows of the
// group's pairs, NT at a time: GroupDots, as GateUpKernel and DownKernel (moe_experts.cu).
// stage_act: the pairs' token rows in shared memory (StageActRows).
template <int kType, int NT, bool kUp>
__global__ void __launch_bounds__(kWarps * 32)
    WarpDotProductKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h, bool stage_act) {
  // After the wait, as GateUpKernel: the down kernel after up's launch reads the routing before
  // its own wait.
  WaitForPredecessor();
  AllowDependents();
  constexpr int G = kLanes<kType>;
  const int lane = threadIdx.x % 32;
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const int64_t r0 = GridLaneGroup<kLanes<kType>>() * kRows;
  const DevMatrix m{kType, a.n_ff, a.n_embd, base + (kUp ? a.up_offset : 0)};
  RowRef rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = r0 + r < a.n_ff ? MatrixRow<kType>(m, r0 + r) : RowRef{};
  for (int g = 0; g < n_pairs; g += NT) {
    int pair[NT];
    float acc[kRows][NT];
    PairRunDots<kType>(rows, a.n_embd, pairs, g, n_pairs, a.k, act, stage_act, pair, acc);
    if (lane % G != 0) continue;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (pair[t] >= 0 && rows[r].q != nullptr) Store<kUp>(h, int64_t(pair[t]) * a.n_ff + r0 + r, acc[r][t]);
  }
}

// The same for the block types: BlockGroupDots, as KQuantGateUpKernel (kquant_experts.cu).
template <int kType, int NT, bool kUp>
__global__ void __launch_bounds__(kWarps * 32)
    BlockDotProductKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h) {
  WaitForPredecessor();
  AllowDependents();  // after the wait, as WarpDotProductKernel
  const int lane = threadIdx.x % 32;
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const int64_t r0 = GridLaneGroup<kLanes<kType>>() * kRows;
  const DevMatrix m{kType, a.n_ff, a.n_embd, base + (kUp ? a.up_offset : 0)};
  KQuantRowRef rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = r0 + r < a.n_ff ? BlockRow<kType>(m, r0 + r) : KQuantRowRef{};
  for (int g = 0; g < n_pairs; g += NT) {
    int pair[NT];
    float acc[kRows][NT];
    PairRunBlockDots<kType>(rows, a.n_embd, pairs, g, n_pairs, a.k, act, pair, acc);
    if (lane % kKQuantGroup != 0) continue;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (pair[t] >= 0 && rows[r].m != nullptr) Store<kUp>(h, int64_t(pair[t]) * a.n_ff + r0 + r, acc[r][t]);
  }
}

template <int kType, bool kUp, int NT>
void LaunchProductNT(const ExpertArgs& a, const DevAct& act, float* h, cudaStream_t s) {
  constexpr int kRowsPerBlock = kWarps * (32 / kLanes<kType>)*kRows;
  const dim3 grid((a.n_ff + kRowsPerBlock - 1) / kRowsPerBlock, a.u_count);
  if constexpr (kIsWarpDotType<kType>) {
    const int64_t smem = StagedActSmem<kType>(NT, a.n_embd);
    LaunchPdl(WarpDotProductKernel<kType, NT, kUp>, grid, dim3(kWarps * 32), smem, s, a, act, h, smem > 0);
  } else {
    LaunchPdl(BlockDotProductKernel<kType, NT, kUp>, grid, dim3(kWarps * 32), 0, s, a, act, h);
  }
}

template <int kType, bool kUp>
void LaunchProduct(const ExpertArgs& a, const DevAct& act, float* h, int max_pairs, cudaStream_t s) {
  if (max_pairs <= 1) {
    LaunchProductNT<kType, kUp, 1>(a, act, h, s);
  } else {
    LaunchProductNT<kType, kUp, 8>(a, act, h, s);
  }
}

// Calls launch(std::integral_constant<int, T>{}) for every expert type the backend takes; any
// other is a caller's error (the engine checks types at creation).
template <typename Launch>
void WithAnyExpertType(int type, const char* what, Launch launch) {
  switch (type) {
#define MER_EXPERT_TYPE(T) \
  case T:                  \
    return launch(std::integral_constant<int, T>{});
    MER_EXPERT_TYPE(kDevF32)
    MER_EXPERT_TYPE(kDevF16)
    MER_EXPERT_TYPE(kDevBF16)
    MER_EXPERT_TYPE(kDevQ8_0)
    MER_EXPERT_TYPE(kDevQ2_K)
    MER_EXPERT_TYPE(kDevQ3_K)
    MER_EXPERT_TYPE(kDevQ4_K)
    MER_EXPERT_TYPE(kDevQ5_K)
    MER_EXPERT_TYPE(kDevQ6_K)
    MER_EXPERT_TYPE(kDevIQ4_XS)
    MER_EXPERT_TYPE(kDevIQ2_XXS)
    MER_EXPERT_TYPE(kDevIQ2_XS)
    MER_EXPERT_TYPE(kDevIQ2_S)
    MER_EXPERT_TYPE(kDevIQ3_XXS)
    MER_EXPERT_TYPE(kDevIQ3_S)
    MER_EXPERT_TYPE(kDevIQ1_S)
    MER_EXPERT_TYPE(kDevQ4_0)
    MER_EXPERT_TYPE(kDevIQ4_NL)
    MER_EXPERT_TYPE(kDevQ5_0)
    MER_EXPERT_TYPE(kDevQ4_1)
    MER_EXPERT_TYPE(kDevQ5_1)
#undef MER_EXPERT_TYPE
    default:
      std::fprintf(stderr, "experts (mixed gate/up): %s: unsupported type %d\n", what, type);
      std::abort();
  }
}

// The activation rows a weight type is dotted with: its own type (F32, F16, BF16, Q8_0) or that
// of its block family (kquant_dot.cuh); n_embd whole blocks.
void CheckAct(const char* what, int type, int64_t cols, const DevAct& act) {
  const int block = BlockElemsOf(type);
  const int want = block == 0 ? type : BlockActTypeOf(type);
  if (act.type != want || cols % (block == 0 ? 32 : block) != 0) {
    std::fprintf(stderr, "experts (mixed gate/up) %s: type %d, %lld cols, activation type %d\n", what, type,
                 static_cast<long long>(cols), act.type);
    std::abort();
  }
}

}  // namespace

void LaunchExpertGateUpMixed(const ExpertArgs& a, const DevAct& gate_act, const DevAct& up_act, float* h,
                             int max_group_pairs, cudaStream_t stream) {
  CheckAct("gate", a.type, a.n_embd, gate_act);
  CheckAct("up", a.up_type, a.n_embd, up_act);
  if (a.u_count <= 0) return;
  WithAnyExpertType(a.type, "gate", [&](auto type) {
    LaunchProduct<decltype(type)::value, false>(a, gate_act, h, max_group_pairs, stream);
  });
  WithAnyExpertType(a.up_type, "up", [&](auto type) {
    LaunchProduct<decltype(type)::value, true>(a, up_act, h, max_group_pairs, stream);
  });
}

}  // namespace mer::cuda
