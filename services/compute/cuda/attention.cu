#include "services/compute/cuda/attention.cuh"

#include <cfloat>

#include "services/compute/cuda/cuda_check.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

__device__ float BlockMax(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float m = red[0];
  for (int k = 1; k < kWarps; ++k) m = fmaxf(m, red[k]);
  __syncthreads();
  return m;
}

__device__ double BlockSum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  double s = 0.0;
  for (int k = 0; k < kWarps; ++k) s += red[k];
  __syncthreads();
  return s;
}

__global__ void __launch_bounds__(kThreads) AttentionKernel(const AttentionArgs a) {
  __shared__ float red_f[kWarps];
  __shared__ double red_d[kWarps];
  const int t = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int HD = a.head_dim, KD = a.n_head_kv * HD, kvh = h / (a.n_head / a.n_head_kv);
  const int n_pos = a.pos[t] + 1;
  const float* q = a.q + (int64_t(t) * a.n_head + h) * HD;
  const int64_t base = int64_t(a.seq[t]) * a.max_ctx * KD + kvh * HD;
  float* scores = a.scores + (int64_t(t) * a.n_head + h) * a.max_ctx;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));

  // Scores: one warp per position, lanes across the head.
  float local_max = -FLT_MAX;
  for (int j = warp; j < n_pos; j += kWarps) {
    const float* k = a.k_cache + base + int64_t(j) * KD;
    float s = 0.0f;
    for (int d = lane; d < HD; d += 32) s = fmaf(k[d], q[d], s);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    s *= scale;
    if (lane == 0) scores[j] = s;
    local_max = fmaxf(local_max, s);
  }
  __syncthreads();  // scores[] written by lane 0s, read by all below (global memory, same block)
  const float max = BlockMax(local_max, red_f);
  double local_sum = 0.0;
  for (int j = threadIdx.x; j < n_pos; j += kThreads) {
    const float e = expf(scores[j] - max);
    scores[j] = e;
    local_sum += static_cast<double>(e);
  }
  const float inv = static_cast<float>(1.0 / BlockSum(local_sum, red_d));
  __syncthreads();

  // softmax . V: one thread per output element, positions in order.
  for (int d = threadIdx.x; d < HD; d += kThreads) {
    const float* v = a.v_cache + base + d;
    float acc = 0.0f;
    for (int j = 0; j < n_pos; ++j) acc = fmaf(v[int64_t(j) * KD], scores[j] * inv, acc);
    a.out[(int64_t(t) * a.n_head + h) * HD + d] = acc;
  }
}

}  // namespace

void LaunchAttention(const AttentionArgs& args, int n_tokens, cudaStream_t stream) {
  AttentionKernel<<<dim3(n_tokens, args.n_head), kThreads, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mer::cuda
