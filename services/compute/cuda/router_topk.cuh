// Routing on the GPU, bit for bit as CpuEngine::MoE: for each token, ggml's softmax over the n_expert router logits (f32
// [n_tokens, n_expert]), the top k by probability (ties to the lower id), and with norm_topk the
// weights renormalised over the k chosen (sum in double, clamped at 2^-14 as llama.cpp).
// chosen: int32 [n_tokens, k]; weights: f32 [n_tokens, k]. n_expert <= 1024, k <= 32.
// For a single token (decode), with slot_table and groups given, also writes the expert groups
// of moe_group.cuh (the k experts ascending, one pair each), saving that launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "services/compute/cuda/moe_group.cuh"

namespace mer::cuda {

void LaunchRouterTopK(const float* logits, int n_tokens, int n_expert, int k, bool norm_topk,
                      int32_t* chosen, float* weights, const int32_t* slot_table, const MoeGroups* groups,
                      cudaStream_t stream);

}  // namespace mer::cuda
