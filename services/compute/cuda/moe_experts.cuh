// The experts of one layer, all selected ones in one launch each, reading weights through the
// device-side slot table: expert e of the layer lives at arena + slot_table[e] * slot_bytes as
// gate | up | down (device layout, device_layout.cuh), each [rows, cols]; down of its own type
// (Q4_K_M files mix them). LaunchExpertGateUp takes gate and up of one type; a layer whose gate
// and up differ takes LaunchExpertGateUpMixed (expert_product.cuh). Matrices of the types of
// kquant_layout.cuh: kquant_experts.cuh.
//
// GateUp: h[p, :] = silu(gate . x[t]) * (up . x[t]) for every pair p = t * k + j routed to a used
//   expert (moe_group.cuh), act: token rows of the gate's dot type; h: f32 [n_pairs, n_ff].
// Down:   out[p, :] = down . h_act[p], act: pair rows of the down's dot type; out f32 [n_pairs, n_embd].
// Groups u in [u_begin, u_begin + u_count) ∩ [0, *n_used) are processed (the host splits a layer
// into passes when the arena cannot hold all its experts at once).
// An expert-parallel rank (held set) processes only the groups of its experts (expert_parallel.h),
// whose slot_table entries are the only ones >= 0; the blocks of the others' return at once.
// n_embd and n_ff multiples of 32; every processed expert's slot_table entry must be >= 0 (trap).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/moe_group.cuh"

namespace mer::cuda {

struct ExpertArgs {
  int type;       // weight type of gate
  int down_type;  // weight type of down
  const uint8_t* arena;
  int64_t slot_bytes;
  const int32_t* slot_table;       // this layer's [n_expert] -> slot or -1
  int64_t up_offset, down_offset;  // bytes from the slot start
  int32_t n_embd, n_ff, k;
  int up_type;  // weight type of up (equal to type for LaunchExpertGateUp); in k's padding: no offset moves
  const int32_t* n_used;
  const int32_t* used;
  const int32_t* begin;
  const int32_t* pairs;
  int u_begin, u_count;
  const uint8_t* held;  // expert parallelism: this layer's [n_expert], non-zero for this rank's experts; null: all
};

void LaunchExpertGateUp(const ExpertArgs& args, const DevAct& x_act, float* h, int max_group_pairs,
                        cudaStream_t stream);
void LaunchExpertDown(const ExpertArgs& args, const DevAct& h_act, float* out, int max_group_pairs,
                      cudaStream_t stream);
// One pair per expert (a decode step): Down from the f32 SwiGLU output h [n_pairs, n_ff], each
// block converting its pair's row to the down matrix's dot type itself (the bytes LaunchQuantize
// would write). For the types ExpertDownConvertsInput accepts (not the K-quants).
bool ExpertDownConvertsInput(int down_type, int64_t n_ff);
void LaunchExpertDownFromF32(const ExpertArgs& args, const float* h, float* out, cudaStream_t stream);

}  // namespace mer::cuda
