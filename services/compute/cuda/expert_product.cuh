// Gate/up of a layer whose gate and up experts differ in type (any two of the types the expert
// kernels take), with moe_experts.cuh's semantics: h[p, :] = silu(gate . gate_act[t]) *
// (up . up_act[t]) for every processed pair p = t * k + j, bit for bit the CPU engine's: each row's
// sum through the device functions of the fused kernels (GroupDots, BlockGroupDots: the CPU
// kernel's lanes, chains and tree), SwiGLU the same float operations.
//
// Two launches of one routed product each: gate's writes its sums into h, up's reads them back
// and writes SwiGLU in their place. Why not fused: the fused kernels read gate and up rows in
// neighbouring lane groups with one type's row layout and one activation row, and a fused kernel
// per pair of types would be hundreds more instantiations for layers that are rare (llama.cpp's
// recipes keep gate and up equal). Split, a mixed layer pays one more launch and h's round trip
// through L2, and the same-type kernels stay as they are.
//
// args.type: gate's weight type; args.up_type: up's; gate_act and up_act: token rows of each one's
// dot type (may be the same rows where the two share it). h: f32 [n_pairs, n_ff]. Sizes and
// passes as moe_experts.cuh (n_embd a multiple of each type's block).
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/moe_experts.cuh"

namespace mer::cuda {

void LaunchExpertGateUpMixed(const ExpertArgs& args, const DevAct& gate_act, const DevAct& up_act, float* h,
                             int max_group_pairs, cudaStream_t stream);

}  // namespace mer::cuda
