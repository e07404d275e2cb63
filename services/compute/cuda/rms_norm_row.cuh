// One block's RMSNorm of one f32 row (BlockRmsNormRow), for kernels that normalise their own input
// instead of reading a norm kernel's output (a launch and a hand-off less per use on the decode
// step): the values RmsNormKernel writes (rms_norm.cu), whose block sum and scale (BlockRmsScale)
// it shares. Its threads hold other elements than RmsNormKernel's, so the squares are summed in
// double in another grouping; a double sum of float squares is exact up to its last bits in any
// order, which the float mean does not see.
//
// Thread t holds float4s t, t + kThreads, ... of the row (n % 4 == 0, n <= kThreads * 4 * kPerThread).
// LoadWeights may run before WaitForPredecessor; Normalize (every thread of the block) after it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

// The block-wide sum of every thread's `sum`, in every thread: a butterfly within each warp,
// then the warps' sums in warp order (the reduction of the RMSNorm kernels). Every thread of the
// block calls it; `partial` holds kThreads / 32 doubles of shared memory.
template <int kThreads>
__device__ __forceinline__ double BlockSumDouble(double sum, double* partial) {
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  double total = 0.0;
  for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
  return total;
}

// 1 / sqrt(mean + eps) of a row of n whose squares the block's threads summed (sum: each thread's
// part), as RmsNormKernel and ggml round it. Every thread of the block calls it.
template <int kThreads>
__device__ __forceinline__ float BlockRmsScale(double sum, int64_t n, float eps) {
  __shared__ double partial[kThreads / 32];
  const double total = BlockSumDouble<kThreads>(sum, partial);
  const float mean = static_cast<float>(total / static_cast<double>(n));
  return 1.0f / sqrtf(mean + eps);
}

template <int kThreads, int kPerThread>
struct BlockRmsNormRow {
  float4 w[kPerThread];
  float4 v[kPerThread];  // the row, normalised by Normalize

  __device__ static int64_t Index(int k) { return (int64_t(threadIdx.x) + int64_t(k) * kThreads) * 4; }

  __device__ void LoadWeights(const float* norm_w, int64_t n) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k)
      w[k] = Index(k) < n ? *reinterpret_cast<const float4*>(norm_w + Index(k)) : make_float4(0, 0, 0, 0);
  }

  // x is read through L2 (an earlier kernel of the stream wrote it).
  __device__ void Normalize(const float* x, int64_t n, float eps) {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k)
      v[k] = Index(k) < n ? __ldcg(reinterpret_cast<const float4*>(x + Index(k))) : make_float4(0, 0, 0, 0);
    double sum = 0.0;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      sum += static_cast<double>(__fmul_rn(v[k].x, v[k].x));
      sum += static_cast<double>(__fmul_rn(v[k].y, v[k].y));
      sum += static_cast<double>(__fmul_rn(v[k].z, v[k].z));
      sum += static_cast<double>(__fmul_rn(v[k].w, v[k].w));
    }
    const float scale = BlockRmsScale<kThreads>(sum, n, eps);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      v[k].x = __fmul_rn(__fmul_rn(v[k].x, scale), w[k].x);
      v[k].y = __fmul_rn(__fmul_rn(v[k].y, scale), w[k].y);
      v[k].z = __fmul_rn(__fmul_rn(v[k].z, scale), w[k].z);
      v[k].w = __fmul_rn(__fmul_rn(v[k].w, scale), w[k].w);
    }
  }

  __device__ void StoreF32(float* out, int64_t n) const {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k)
      if (Index(k) < n) *reinterpret_cast<float4*>(out + Index(k)) = v[k];
  }
};

}  // namespace mer::cuda
