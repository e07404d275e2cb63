#include "services/compute/cuda/attention.cuh"

#include <cfloat>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/ggml_math.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;

// The CPU engine's attention (CpuEngine::Attention) operation for operation: scores by
// ggml_vec_dot_f32, ggml's soft_max over the KV window rounded up to 16, and softmax . V in
// ggml_vec_dot_f32's 64 fma lanes (cell j in lane j % 64), reduced as ReduceAcc64.
__global__ void __launch_bounds__(kThreads) AttentionKernel(const AttentionArgs a) {
  __shared__ float red_f[kWarps];
  __shared__ float inv_sum;
  const int t = blockIdx.x, h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int HD = a.head_dim, KD = a.n_head_kv * HD, kvh = h / (a.n_head / a.n_head_kv);
  const int n_pos = a.pos[t] + 1;
  const int n_groups = (n_pos + 15) / 16;
  const float* q = a.q + (int64_t(t) * a.n_head + h) * HD;
  const int64_t base = int64_t(a.seq[t]) * a.max_ctx * KD + kvh * HD;
  float* x = a.scores + (int64_t(t) * a.n_head + h) * AttentionScoresStride(a.max_ctx);
  float* group_sum = x + a.max_ctx;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));

  float local_max = -FLT_MAX;
  for (int j = threadIdx.x; j < n_pos; j += kThreads) {
    const float s = __fmul_rn(DotF32GgmlVec4(a.k_cache + base + int64_t(j) * KD, q, HD), scale);
    x[j] = s;
    local_max = fmaxf(local_max, s);
  }
  for (int o = 16; o > 0; o >>= 1) local_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, o));
  if (lane == 0) red_f[warp] = local_max;
  __syncthreads();  // also orders the x[] writes above before the reads below (same block)
  float max = red_f[0];
  for (int w = 1; w < kWarps; ++w) max = fmaxf(max, red_f[w]);
  for (int gi = threadIdx.x; gi < n_groups; gi += kThreads) {
    float v[16];
#pragma unroll
    for (int l = 0; l < 16; ++l) {
      const int k = gi * 16 + l;
      v[l] = k < n_pos ? GgmlExpf(__fsub_rn(x[k], max)) : 0.0f;
      if (k < n_pos) x[k] = v[l];
    }
    group_sum[gi] = ReduceAdd16(v);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int gi = 0; gi < n_groups; ++gi) sum += static_cast<double>(group_sum[gi]);
    inv_sum = static_cast<float>(1.0 / sum);
  }
  __syncthreads();
  const float inv = inv_sum;
  for (int j = threadIdx.x; j < n_pos; j += kThreads) x[j] = __fmul_rn(x[j], inv);
  __syncthreads();

  for (int d = threadIdx.x; d < HD; d += kThreads) {
    const float* v = a.v_cache + base + d;
    // Cell j goes to lane j % 64 in increasing j; 64 cells per pass keep 64 loads in flight.
    float lanes[64];
#pragma unroll
    for (int l = 0; l < 64; ++l) lanes[l] = 0.0f;
    int j0 = 0;
    for (; j0 + 64 <= n_pos; j0 += 64) {
#pragma unroll
      for (int l = 0; l < 64; ++l) lanes[l] = fmaf(v[int64_t(j0 + l) * KD], x[j0 + l], lanes[l]);
    }
#pragma unroll
    for (int l = 0; l < 64; ++l)
      if (j0 + l < n_pos) lanes[l] = fmaf(v[int64_t(j0 + l) * KD], x[j0 + l], lanes[l]);
    a.out[(int64_t(t) * a.n_head + h) * HD + d] = ReduceAcc64(lanes);
  }
}

}  // namespace

void LaunchAttention(const AttentionArgs& args, int n_tokens, cudaStream_t stream) {
  AttentionKernel<<<dim3(n_tokens, args.n_head), kThreads, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mer::cuda
