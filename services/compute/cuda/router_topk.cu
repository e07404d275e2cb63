#include "services/compute/cuda/router_topk.cuh"

#include <cfloat>

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/ggml_math.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/rms_norm_row.cuh"
#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {
namespace {

constexpr int kMaxExperts = 1024;

__device__ void WriteChoices(float my_w, int32_t my_e, int t, int k, bool norm_topk, int32_t* chosen, float* weights,
                             const int32_t* slot_table, const MoeGroups& groups);

// ReduceAdd16 (ggml_math.cuh) over the 16 lanes of each half-warp; the sum in the half's lane 0.
__device__ inline float HalfWarpReduceAdd16(float v) {
  constexpr unsigned kAll = 0xffffffffu;
  v = __fadd_rn(__shfl_down_sync(kAll, v, 8, 16), v);  // a[i] = v[i + 8] + v[i]
  v = __fadd_rn(__shfl_down_sync(kAll, v, 4, 16), v);  // b[i] = a[i + 4] + a[i]
  v = __fadd_rn(v, __shfl_down_sync(kAll, v, 2, 16));  // b0 + b2, b1 + b3
  return __fadd_rn(v, __shfl_down_sync(kAll, v, 1, 16));
}

// The same softmax and choices by a whole block, for n_expert a multiple of 16 (every warp's
// shuffles whole): a half-warp per group of 16 exps, and each probability's rank among all (larger
// first, ties to the lower id) instead of k rounds of arg-max; the same floats and the same
// choices. p: the logits (shared), overwritten; choice j in sel_w[j], sel_e[j] (shared) after it.
__device__ void SelectTopKBlock(float* p, float* group_sum, float* red, float* sel_w, int32_t* sel_e, int n_expert,
                                int k) {
  constexpr unsigned kAll = 0xffffffffu;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, n_warps = blockDim.x / 32;
  float m = -FLT_MAX;
  for (int e = tid; e < n_expert; e += blockDim.x) m = fmaxf(m, p[e]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kAll, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < n_warps; ++w) m = fmaxf(m, red[w]);
  for (int e0 = warp * 32; e0 < n_expert; e0 += blockDim.x) {
    const int e = e0 + lane;
    const bool in = e < n_expert;
    const float v = in ? GgmlExpf(__fsub_rn(p[e], m)) : 0.0f;
    if (in) p[e] = v;
    const float sum = HalfWarpReduceAdd16(v);
    if (in && lane % 16 == 0) group_sum[e / 16] = sum;
  }
  __syncthreads();
  double sum = 0.0;  // every thread, in group order: the same value in all
  for (int gi = 0; gi < n_expert / 16; ++gi) sum += static_cast<double>(group_sum[gi]);
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = tid; e < n_expert; e += blockDim.x) p[e] = __fmul_rn(p[e], inv);
  __syncthreads();
  for (int e = tid; e < n_expert; e += blockDim.x) {
    const float v = p[e];
    int rank = 0;  // 16 probabilities per step (n_expert % 16 == 0; p is 16-byte aligned)
    for (int o0 = 0; o0 < n_expert; o0 += 16) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 q = reinterpret_cast<const float4*>(p + o0)[k];
        const int o = o0 + 4 * k;
        rank += (q.x > v || (q.x == v && o < e)) + (q.y > v || (q.y == v && o + 1 < e)) +
                (q.z > v || (q.z == v && o + 2 < e)) + (q.w > v || (q.w == v && o + 3 < e));
      }
    }
    if (rank < k) {
      sel_w[rank] = v;
      sel_e[rank] = e;
    }
  }
  __syncthreads();
}

// cpu::Softmax(p, n_expert, 1.0f) exactly, by one warp, in place (p: shared, n_expert floats):
// exps of whole groups of 16 by GgmlExpf, each group summed by ReduceAdd16 and the group sums
// added in order in double; a tail past the last group (n_expert % 16 != 0) by GlibcExpf.
__device__ void SoftmaxWarp(float* p, float* group_sum, int n_expert) {
  const int lane = threadIdx.x % 32;
  float m = -FLT_MAX;
  for (int e = lane; e < n_expert; e += 32) m = fmaxf(m, p[e]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int n_groups = n_expert / 16;
  for (int gi = lane; gi < n_groups; gi += 32) {
    float v[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) p[gi * 16 + l] = v[l] = GgmlExpf(__fsub_rn(p[gi * 16 + l], m));
    group_sum[gi] = ReduceAdd16(v);
  }
  __syncwarp();
  float inv = 0.0f;
  if (lane == 0) {
    double sum = 0.0;
    for (int gi = 0; gi < n_groups; ++gi) sum += static_cast<double>(group_sum[gi]);
    for (int e = n_groups * 16; e < n_expert; ++e) {
      p[e] = GlibcExpf(__fsub_rn(p[e], m));
      sum += static_cast<double>(p[e]);
    }
    inv = static_cast<float>(1.0 / sum);
  }
  inv = __shfl_sync(0xffffffffu, inv, 0);
  __syncwarp();
  for (int e = lane; e < n_expert; e += 32) p[e] = __fmul_rn(p[e], inv);
  __syncwarp();
}

// Softmax, top-k and renormalisation of one token's logits by one warp; logits in p (shared,
// n_expert floats), overwritten.
__device__ void TopKWarp(float* p, float* group_sum, int t, int n_expert, int k, bool norm_topk, int32_t* chosen,
                         float* weights, const int32_t* slot_table, const MoeGroups& groups) {
  const int lane = threadIdx.x % 32;
  SoftmaxWarp(p, group_sum, n_expert);

  // k rounds of arg-max (ties to the lower id); a chosen expert's probability becomes -1. Lane j
  // keeps the j-th choice, so what follows runs across lanes (no per-thread arrays, which would
  // live in local memory on this critical path).
  constexpr unsigned kAll = 0xffffffffu;
  float my_w = 0.0f;
  int32_t my_e = -1;
  for (int j = 0; j < k; ++j) {
    float best = -2.0f;
    int best_e = n_expert;
    for (int e = lane; e < n_expert; e += 32)
      if (p[e] > best) {
        best = p[e];
        best_e = e;
      }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(kAll, best, o);
      const int oe = __shfl_xor_sync(kAll, best_e, o);
      if (ov > best || (ov == best && oe < best_e)) {
        best = ov;
        best_e = oe;
      }
    }
    if (lane == j) {
      my_w = best;
      my_e = best_e;
    }
    if (lane == 0) p[best_e] = -1.0f;
    __syncwarp();
  }
  WriteChoices(my_w, my_e, t, k, norm_topk, chosen, weights, slot_table, groups);
}

// The k choices of token t, choice j in lane j (my_w, my_e; the j-th largest probability, ties to
// the lower id), written out by one warp: renormalised weights and, with slot_table, the groups.
__device__ void WriteChoices(float my_w, int32_t my_e, int t, int k, bool norm_topk, int32_t* chosen, float* weights,
                             const int32_t* slot_table, const MoeGroups& groups) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  float div = 1.0f;
  if (norm_topk) {
    double ws = 0.0;  // in choice order, as the CPU
    for (int j = 0; j < k; ++j) ws += static_cast<double>(__shfl_sync(kAll, my_w, j));
    div = fmaxf(static_cast<float>(ws), 6.103515625e-5f);
  }
  const bool chooser = lane < k;
  if (chooser) {
    chosen[int64_t(t) * k + lane] = my_e;
    weights[int64_t(t) * k + lane] = norm_topk ? __fdiv_rn(my_w, div) : my_w;
  }
  if (slot_table == nullptr) return;
  // A single token: its k experts, ascending, are the groups (moe_group.cuh's output), one pair
  // each: choice j goes to its rank among the k.
  int rank = 0;
  for (int j = 0; j < k; ++j) rank += __shfl_sync(kAll, my_e, j) < my_e;
  const unsigned missing = __ballot_sync(kAll, chooser && slot_table[chooser ? my_e : 0] < 0);
  if (chooser) {
    groups.used[rank] = my_e;
    groups.begin[rank] = rank;
    groups.pairs[rank] = lane;
  }
  if (lane == 0) {
    groups.begin[k] = k;
    *groups.n_used = k;
    *groups.n_missing = __popc(missing);
    atomicAdd(groups.lookups_total, static_cast<unsigned long long>(k));  // no load to wait for at the end
  }
}

// One warp per token (no block barriers: routing is on the decode step's critical path).
__global__ void __launch_bounds__(32)
    RouterTopKKernel(const float* logits, int n_expert, int k, bool norm_topk, int32_t* chosen, float* weights,
                     const int32_t* slot_table, MoeGroups groups) {
  __shared__ float p[kMaxExperts];
  __shared__ float group_sum[kMaxExperts / 16];
  AllowDependents();
  WaitForPredecessor();
  const int t = blockIdx.x;
  for (int e = threadIdx.x; e < n_expert; e += 32) p[e] = logits[int64_t(t) * n_expert + e];
  __syncwarp();
  TopKWarp(p, group_sum, t, n_expert, k, norm_topk, chosen, weights, slot_table, groups);
}

// Preselected routes: the k given experts of token t (chosen, read and written back unchanged)
// weighted by their probabilities in RouterTopKKernel's softmax, renormalised as its choices are.
__global__ void __launch_bounds__(32)
    RouteWeightsKernel(const float* logits, int n_expert, int k, bool norm_topk, int32_t* chosen, float* weights) {
  __shared__ float p[kMaxExperts];
  __shared__ float group_sum[kMaxExperts / 16];
  AllowDependents();
  WaitForPredecessor();
  const int t = blockIdx.x, lane = threadIdx.x;
  for (int e = lane; e < n_expert; e += 32) p[e] = logits[int64_t(t) * n_expert + e];
  __syncwarp();
  SoftmaxWarp(p, group_sum, n_expert);
  const int32_t my_e = lane < k ? chosen[int64_t(t) * k + lane] : -1;
  const float my_w = lane < k ? p[my_e] : 0.0f;
  WriteChoices(my_w, my_e, t, k, norm_topk, chosen, weights, nullptr, MoeGroups{});
}

constexpr int kRouterWarps = 4;
constexpr int kRouterMaxCols = 4096;

// Router1Norm: the residual row normalised into xs by every block (BlockRmsNormRow, its weights
// loaded before the wait), then the grid's warps write the experts' activations, warp w of the
// grid the 32-element blocks w, w + the grid's warps, ...
__device__ void NormIntoShared(const Router1Args& a, float* xs) {
  BlockRmsNormRow<kRouterWarps * 32, kRouterMaxCols / (kRouterWarps * 32 * 4)> norm;
  norm.LoadWeights(a.norm.w, a.n_embd);
  WaitForPredecessor();
  norm.Normalize(a.norm.residual, a.n_embd, a.norm.eps);
  norm.StoreF32(xs, a.n_embd);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, grid_warps = gridDim.x * kRouterWarps;
  for (int b = blockIdx.x * kRouterWarps + warp; b < a.n_embd / 32; b += grid_warps)
    StoreAct(a.norm.act, 0, b * 32 + lane, xs[b * 32 + lane]);
}

// One token, f32 router of n_embd a multiple of 64 and at most kRouterMaxCols: the router mat-vec
// (a warp per expert row, ggml_vec_dot_f32's 64 lanes as GroupDots<kDevF32>: lane l holds lanes l
// and l + 32, added, then the same tree), then the last block to finish does the top-k, so routing
// is one launch. With a next router, its rows are computed on the same x too and the last block's
// second warp does their top-k (the look-ahead prediction). The weights are loaded before waiting
// for the kernel that writes x (or, with norm.residual, the residual: NormIntoShared).
__global__ void __launch_bounds__(kRouterWarps * 32) RouterTopK1Kernel(const __grid_constant__ Router1Args a) {
  __shared__ __align__(16) float p[2][kMaxExperts];
  __shared__ float group_sum[2][kMaxExperts / 16];
  __shared__ bool last;
  // The slot tables (this layer's, and the next one's with a prediction) for the last block's
  // groups: host uploads and stream order, not an earlier kernel, write them, so they are read
  // before the wait; after it, each choice's lookup would be a DRAM round trip at the routing's end.
  __shared__ int32_t slots[2][kMaxExperts];
  AllowDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = threadIdx.x; i < a.n_expert; i += blockDim.x) {
    if (a.slot_table != nullptr) slots[0][i] = __ldcg(a.slot_table + i);
    if (a.next.slot_table != nullptr) slots[1][i] = __ldcg(a.next.slot_table + i);
  }
  const int32_t* slot_table = a.slot_table != nullptr ? slots[0] : nullptr;
  const int32_t* next_slot_table = a.next.slot_table != nullptr ? slots[1] : nullptr;
  const int n_rows = a.n_expert * (a.next.router != nullptr ? 2 : 1);
  const int row = blockIdx.x * kRouterWarps + warp;
  const bool active = row < n_rows;
  const bool next = row >= a.n_expert;
  const float* w = (next ? a.next.router : a.router) + int64_t(active ? row % a.n_expert : 0) * a.n_embd;
  constexpr int kMaxSteps = kRouterMaxCols / 64;
  const int steps = a.n_embd / 64;
  float w0[kMaxSteps], w1[kMaxSteps];
#pragma unroll
  for (int i = 0; i < kMaxSteps; ++i) {
    if (i >= steps) break;
    w0[i] = active ? __ldcs(w + i * 64 + lane) : 0.0f;
    w1[i] = active ? __ldcs(w + i * 64 + 32 + lane) : 0.0f;
  }
  // x into shared memory first: read straight from global inside the loop below, each load would
  // wait behind the previous step's fma and its loop-exit branch (one L2 round trip per step).
  __shared__ __align__(16) float xs[kRouterMaxCols];
  if (a.norm.residual != nullptr) {
    NormIntoShared(a, xs);
  } else {
    WaitForPredecessor();
    for (int i = threadIdx.x * 4; i < a.n_embd; i += blockDim.x * 4)
      *reinterpret_cast<float4*>(xs + i) = __ldcg(reinterpret_cast<const float4*>(a.x + i));
    __syncthreads();
  }
  float acc = 0.0f, hi = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxSteps; ++i) {
    if (i >= steps) break;
    acc = fmaf(w0[i], xs[i * 64 + lane], acc);
    hi = fmaf(w1[i], xs[i * 64 + 32 + lane], hi);
  }
  acc = GroupReduce<kDevF32>(__fadd_rn(acc, hi));
  if (lane == 0 && active) (next ? a.next.logits : a.logits)[row % a.n_expert] = acc;
  // The last block to finish reads every block's logits (threadFenceReduction pattern).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.blocks_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  const int n_tables = a.next.router != nullptr ? 2 : 1;  // 0: this layer, 1: the prediction
  if (threadIdx.x == 0) *a.blocks_done = 0;               // ready for the next launch (graph replays reuse it)
  if (a.n_expert % 16 == 0) {
    __shared__ float red[kRouterWarps];
    __shared__ float sel_w[2][32];
    __shared__ int32_t sel_e[2][32];
    for (int which = 0; which < n_tables; ++which) {
      const float* logits = which == 0 ? a.logits : a.next.logits;
      for (int i = threadIdx.x; i < a.n_expert; i += blockDim.x) p[which][i] = __ldcg(logits + i);
      __syncthreads();
      SelectTopKBlock(p[which], group_sum[which], red, sel_w[which], sel_e[which], a.n_expert, a.k);
    }
    if (warp >= n_tables) return;
    const bool in = lane < a.k;
    const float my_w = in ? sel_w[warp][lane] : 0.0f;
    const int32_t my_e = in ? sel_e[warp][lane] : -1;
    if (warp == 0)
      WriteChoices(my_w, my_e, 0, a.k, a.norm_topk, a.chosen, a.weights, slot_table, a.groups);
    else
      WriteChoices(my_w, my_e, 0, a.k, a.norm_topk, a.next.chosen, a.next.weights, next_slot_table, a.next.groups);
    return;
  }
  const int which = warp;
  if (which >= n_tables) return;
  const float* logits = which == 0 ? a.logits : a.next.logits;
  for (int i = lane; i < a.n_expert; i += 32) p[which][i] = __ldcg(logits + i);
  __syncwarp();
  if (which == 0)
    TopKWarp(p[0], group_sum[0], 0, a.n_expert, a.k, a.norm_topk, a.chosen, a.weights, slot_table, a.groups);
  else
    TopKWarp(p[1], group_sum[1], 0, a.n_expert, a.k, a.norm_topk, a.next.chosen, a.next.weights, next_slot_table,
             a.next.groups);
}

}  // namespace

void LaunchRouterTopK(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk, int32_t* chosen,
                      float* weights, const int32_t* slot_table, const MoeGroups* groups, cudaStream_t stream) {
  LaunchPdl(RouterTopKKernel, dim3(n_tokens), dim3(32), 0, stream, logits, n_expert, k, norm_topk, chosen, weights,
            n_tokens == 1 ? slot_table : nullptr, groups != nullptr ? *groups : MoeGroups{});
}

void LaunchRouteWeights(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk, int32_t* chosen,
                        float* weights, cudaStream_t stream) {
  LaunchPdl(RouteWeightsKernel, dim3(n_tokens), dim3(32), 0, stream, logits, n_expert, k, norm_topk, chosen, weights);
}

bool RouterTopK1Supported(int64_t n_embd, int n_expert) {
  return n_embd % 64 == 0 && n_embd <= kRouterMaxCols && n_expert <= kMaxExperts;
}

bool RouterTopK1NormSupported(int act_type) { return StoreActWrites(act_type); }

void LaunchRouterTopK1(const Router1Args& args, cudaStream_t stream) {
  const int rows = args.n_expert * (args.next.router != nullptr ? 2 : 1);
  LaunchPdl(RouterTopK1Kernel, dim3((rows + kRouterWarps - 1) / kRouterWarps), dim3(kRouterWarps * 32), 0, stream,
            args);
}

}  // namespace mer::cuda
