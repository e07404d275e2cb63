// LaunchExpertGateUp / LaunchExpertDown (moe_experts.cuh) for expert matrices of the types of
// kquant_layout.cuh: gate and up of type args.type, down of args.down_type, each dispatched here
// when it is one of these. Activations Q8_K (kquant_layout.cuh; n_embd for gate/up, n_ff for down
// multiples of 256) or, for the types of 32-element blocks, Q8_0 or Q8_1 (multiples of 32). Same
// semantics and outputs as moe_experts.cuh, bit-exact with the CPU engine.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/moe_experts.cuh"

namespace mer::cuda {

void LaunchExpertGateUpKQuant(const ExpertArgs& args, const DevAct& x_act, float* h, int max_group_pairs,
                              cudaStream_t stream);
void LaunchExpertDownKQuant(const ExpertArgs& args, const DevAct& h_act, float* out, int max_group_pairs,
                            cudaStream_t stream);

}  // namespace mer::cuda
