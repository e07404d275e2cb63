#include "services/compute/cuda/qk_norm_rope.cuh"

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/ggml_math.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

__global__ void QkNormRopeKernel(const QkNormRopeArgs a) {
  extern __shared__ double squares[];  // [head_dim], then f32 [head_dim]
  AllowDependents();
  WaitForPredecessor();
  float* head = reinterpret_cast<float*>(squares + blockDim.x);
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const int HD = a.head_dim, KD = a.n_head_kv * HD, half = HD / 2;
  const bool is_q = h < a.n_head;
  const int hk = h - a.n_head;
  const float* src = is_q ? a.q + (int64_t(t) * a.n_head + h) * HD : a.k + int64_t(t) * KD + hk * HD;
  const float x = src[d];
  // head_dim may be below a warp (16 in the unit-test geometry): reduce through shared memory, the
  // CPU's chain in one thread (run by every thread of the head, it took 86 us a layer at 1,024
  // tokens on the H100, 50 in one).
  __shared__ float head_scale;
  squares[d] = static_cast<double>(x * x);
  __syncthreads();
  if (d == 0) {
    double total = 0.0;
    for (int k = 0; k < HD; ++k) total += squares[k];
    const float mean = static_cast<float>(total / static_cast<double>(HD));
    head_scale = 1.0f / sqrtf(mean + a.eps);
  }
  __syncthreads();
  head[d] = __fmul_rn(__fmul_rn(x, head_scale), (is_q ? a.q_norm : a.k_norm)[d]);
  __syncthreads();
  const int i = d < half ? d : d - half;
  const float c = a.rope_cos[int64_t(t) * half + i], sn = a.rope_sin[int64_t(t) * half + i];
  const float x0 = head[i], x1 = head[i + half];
  const float out = RopeNeoxAt(d, half, x0, x1, c, sn);
  if (is_q) {
    a.q[(int64_t(t) * a.n_head + h) * HD + d] = out;
  } else {
    const int64_t cell = (int64_t(a.seq[t]) * a.max_ctx + a.pos[t]) * KD + hk * HD + d;
    a.k_cache[cell] = out;
    a.v_cache[cell] = a.v[int64_t(t) * KD + hk * HD + d];
  }
}

}  // namespace

void LaunchQkNormRope(const QkNormRopeArgs& args, int n_tokens, cudaStream_t stream) {
  LaunchPdl(QkNormRopeKernel, dim3(n_tokens, args.n_head + args.n_head_kv), dim3(args.head_dim),
            args.head_dim * (sizeof(double) + sizeof(float)), stream, args);
}

}  // namespace mer::cuda
