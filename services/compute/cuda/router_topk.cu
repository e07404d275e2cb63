#include "services/compute/cuda/router_topk.cuh"

#include <cfloat>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/ggml_math.cuh"

namespace mer::cuda {
namespace {

constexpr int kMaxExperts = 1024;

// One warp per token (no block barriers: routing is on the decode step's critical path).
__global__ void __launch_bounds__(32) RouterTopKKernel(const float* logits, int n_expert, int k, bool norm_topk,
                                                      int32_t* chosen, float* weights, const int32_t* slot_table,
                                                      MoeGroups groups) {
  __shared__ float p[kMaxExperts];
  __shared__ float group_sum[kMaxExperts / 16];
  const int t = blockIdx.x, lane = threadIdx.x;
  const float* x = logits + int64_t(t) * n_expert;

  // cpu::Softmax(p, n_expert, 1.0f) exactly: exps of whole groups of 16 by GgmlExpf, each group
  // summed by ReduceAdd16 and the group sums added in order in double; a tail past the last
  // group (n_expert % 16 != 0) by expf, which may differ from glibc's expf in the last ulp.
  float m = -FLT_MAX;
  for (int e = lane; e < n_expert; e += 32) m = fmaxf(m, x[e]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int n_groups = n_expert / 16;
  for (int gi = lane; gi < n_groups; gi += 32) {
    float v[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) p[gi * 16 + l] = v[l] = GgmlExpf(__fsub_rn(x[gi * 16 + l], m));
    group_sum[gi] = ReduceAdd16(v);
  }
  __syncwarp();
  float inv = 0.0f;
  if (lane == 0) {
    double sum = 0.0;
    for (int gi = 0; gi < n_groups; ++gi) sum += static_cast<double>(group_sum[gi]);
    for (int e = n_groups * 16; e < n_expert; ++e) {
      p[e] = expf(__fsub_rn(x[e], m));
      sum += static_cast<double>(p[e]);
    }
    inv = static_cast<float>(1.0 / sum);
  }
  inv = __shfl_sync(0xffffffffu, inv, 0);
  __syncwarp();
  for (int e = lane; e < n_expert; e += 32) p[e] = __fmul_rn(p[e], inv);
  __syncwarp();

  // k rounds of arg-max (ties to the lower id); a chosen expert's probability becomes -1.
  float w_sel[32];
  int32_t e_sel[32];
  for (int j = 0; j < k; ++j) {
    float best = -2.0f;
    int best_e = n_expert;
    for (int e = lane; e < n_expert; e += 32)
      if (p[e] > best) { best = p[e]; best_e = e; }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ov > best || (ov == best && oe < best_e)) { best = ov; best_e = oe; }
    }
    w_sel[j] = best;
    e_sel[j] = best_e;
    if (lane == 0) p[best_e] = -1.0f;
    __syncwarp();
  }
  if (lane != 0) return;
  float div = 1.0f;
  if (norm_topk) {
    double ws = 0.0;
    for (int j = 0; j < k; ++j) ws += w_sel[j];
    div = fmaxf(static_cast<float>(ws), 6.103515625e-5f);
  }
  for (int j = 0; j < k; ++j) {
    chosen[int64_t(t) * k + j] = e_sel[j];
    weights[int64_t(t) * k + j] = norm_topk ? __fdiv_rn(w_sel[j], div) : w_sel[j];
  }
  if (slot_table == nullptr) return;
  // A single token: its k experts are the groups (moe_group.cuh's output), ascending.
  int32_t order[32];
  for (int j = 0; j < k; ++j) order[j] = j;
  for (int a = 1; a < k; ++a)
    for (int b = a; b > 0 && e_sel[order[b]] < e_sel[order[b - 1]]; --b) {
      const int32_t tmp = order[b];
      order[b] = order[b - 1];
      order[b - 1] = tmp;
    }
  int missing = 0;
  for (int u = 0; u < k; ++u) {
    groups.used[u] = e_sel[order[u]];
    groups.begin[u] = u;
    groups.pairs[u] = order[u];
    missing += slot_table[e_sel[order[u]]] < 0;
  }
  groups.begin[k] = k;
  *groups.n_used = k;
  *groups.n_missing = missing;
  *groups.lookups_total += static_cast<unsigned long long>(k);
}

}  // namespace

void LaunchRouterTopK(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk, int32_t* chosen,
                      float* weights, const int32_t* slot_table, const MoeGroups* groups, cudaStream_t stream) {
  RouterTopKKernel<<<n_tokens, 32, 0, stream>>>(logits, n_expert, k, norm_topk, chosen, weights,
                                               n_tokens == 1 ? slot_table : nullptr,
                                               groups != nullptr ? *groups : MoeGroups{});
  CUDA_CHECK_LAUNCH();
}

}  // namespace mer::cuda
