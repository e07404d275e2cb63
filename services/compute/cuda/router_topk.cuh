// Routing on the GPU: for each token, softmax over the n_expert router logits (f32
// [n_tokens, n_expert]), the top k by probability (ties to the lower id), and with norm_topk the
// weights renormalised over the k chosen (sum in double, clamped at 2^-14 as llama.cpp).
// chosen: int32 [n_tokens, k]; weights: f32 [n_tokens, k]. n_expert <= 1024, k <= 32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

void LaunchRouterTopK(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk,
                      int32_t* chosen, float* weights, cudaStream_t stream);

}  // namespace mer::cuda
