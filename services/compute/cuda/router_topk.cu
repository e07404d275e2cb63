#include "services/compute/cuda/router_topk.cuh"

#include <cfloat>

#include "services/compute/cuda/cuda_check.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxExperts = 1024;

__global__ void __launch_bounds__(kThreads) RouterTopKKernel(const float* logits, int n_expert, int k,
                                                             bool norm_topk, int32_t* chosen, float* weights) {
  __shared__ float p[kMaxExperts];
  __shared__ float red_v[kThreads / 32];
  __shared__ int red_i[kThreads / 32];
  __shared__ double red_d[kThreads / 32];
  const int t = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const float* x = logits + int64_t(t) * n_expert;

  float m = -FLT_MAX;
  for (int e = threadIdx.x; e < n_expert; e += kThreads) m = fmaxf(m, x[e]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red_v[warp] = m;
  __syncthreads();
  m = red_v[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, red_v[w]);
  double s = 0.0;
  for (int e = threadIdx.x; e < n_expert; e += kThreads) {
    p[e] = expf(x[e] - m);
    s += static_cast<double>(p[e]);
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) red_d[warp] = s;
  __syncthreads();
  double sum = 0.0;
  for (int w = 0; w < kThreads / 32; ++w) sum += red_d[w];
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = threadIdx.x; e < n_expert; e += kThreads) p[e] *= inv;
  __syncthreads();

  // k rounds of arg-max; a chosen expert's probability is set to -1 (probabilities are >= 0).
  float w_sel[32];
  int32_t e_sel[32];
  for (int j = 0; j < k; ++j) {
    float best = -2.0f;
    int best_e = n_expert;
    for (int e = threadIdx.x; e < n_expert; e += kThreads)
      if (p[e] > best) { best = p[e]; best_e = e; }  // ascending e: ties keep the lower id
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ov > best || (ov == best && oe < best_e)) { best = ov; best_e = oe; }
    }
    if (lane == 0) { red_v[warp] = best; red_i[warp] = best_e; }
    __syncthreads();
    best = red_v[0];
    best_e = red_i[0];
    for (int w = 1; w < kThreads / 32; ++w)
      if (red_v[w] > best || (red_v[w] == best && red_i[w] < best_e)) { best = red_v[w]; best_e = red_i[w]; }
    w_sel[j] = best;
    e_sel[j] = best_e;
    __syncthreads();
    if (threadIdx.x == 0) p[best_e] = -1.0f;
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  float div = 1.0f;
  if (norm_topk) {
    double ws = 0.0;
    for (int j = 0; j < k; ++j) ws += w_sel[j];
    div = fmaxf(static_cast<float>(ws), 6.103515625e-5f);
  }
  for (int j = 0; j < k; ++j) {
    chosen[int64_t(t) * k + j] = e_sel[j];
    weights[int64_t(t) * k + j] = norm_topk ? w_sel[j] / div : w_sel[j];
  }
}

}  // namespace

void LaunchRouterTopK(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk,
                      int32_t* chosen, float* weights, cudaStream_t stream) {
  RouterTopKKernel<<<n_tokens, kThreads, 0, stream>>>(logits, n_expert, k, norm_topk, chosen, weights);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mer::cuda
