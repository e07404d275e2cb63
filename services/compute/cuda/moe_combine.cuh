// x[t, i] += sum_j weights[t, j] * expert_out[t * k + j, i], in top-k order with the CPU engine's
// rounding (its mul + add chain, which GCC contracts to fma). x: f32 [n_tokens, n_embd].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

void LaunchMoeCombine(const float* expert_out, const float* weights, int n_tokens, int k, int64_t n_embd,
                      float* x, cudaStream_t stream);

}  // namespace mer::cuda
