#include "services/compute/cuda/moe_combine.cuh"

#include "services/compute/cuda/cuda_check.cuh"

namespace mer::cuda {
namespace {

__global__ void MoeCombineKernel(const float* expert_out, const float* weights, int k, int64_t n_embd,
                                 float* x) {
  const int64_t t = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_embd) return;
  const float* e = expert_out + t * k * n_embd + i;
  const float* w = weights + t * k;
  float acc = __fmul_rn(e[0], w[0]);
  // The CPU engine's `acc + ej * wj`, which GCC contracts to fma(ej, wj, acc) (-mfma, C++).
  for (int j = 1; j < k; ++j) acc = fmaf(e[j * n_embd], w[j], acc);
  x[t * n_embd + i] = __fadd_rn(acc, x[t * n_embd + i]);
}

}  // namespace

void LaunchMoeCombine(const float* expert_out, const float* weights, int n_tokens, int k, int64_t n_embd,
                      float* x, cudaStream_t stream) {
  MoeCombineKernel<<<dim3((n_embd + 255) / 256, n_tokens), 256, 0, stream>>>(expert_out, weights, k, n_embd, x);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mer::cuda
