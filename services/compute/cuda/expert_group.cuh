#pragma once
// What every routed-expert kernel (moe_experts.cu, expert_product.cu, kquant_experts.cu) does
// before its dot products: find its block's expert group and that group's pairs, and take the
// pairs a run of NT at a time with their activation rows. Device code; the grid is
// (blocks over the rows, expert groups u_count), kExpertWarps warps a block.

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/kquant_dot.cuh"
#include "services/compute/cuda/moe_experts.cuh"
#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {

inline constexpr int kExpertWarps = 4;  // warps per block of every expert kernel

// The block's expert group (u = u_begin + blockIdx.y): the start of its expert's slot in the
// arena, its pairs and their count; nullptr when the block has no group or, on an expert-parallel
// rank, its expert is another rank's (uniform over the block).
// The routing's outputs and the slot table are read through L2 (ld.cg): a down kernel reads them
// before its WaitForPredecessor, where an L1 line of an earlier kernel could be stale. The
// group's count, expert and range are loaded together (one round trip, not one per dependent
// step: used and begin have n_expert + 1 entries, so u < n_expert is in range), then its slot.
__device__ inline const uint8_t* GroupExpert(const ExpertArgs& a, int* n_pairs, const int32_t** pairs) {
  const int u = a.u_begin + blockIdx.y;
  if (blockIdx.y >= a.u_count) return nullptr;
  const int n_used = __ldcg(a.n_used);
  const int e = __ldcg(a.used + u);
  const int32_t begin = __ldcg(a.begin + u), end = __ldcg(a.begin + u + 1);
  if (u >= n_used) return nullptr;
  const int32_t slot = __ldcg(a.slot_table + e);
  if (slot < 0) {
    // Another rank's expert (its entry is -1 here): none of this rank's work. The check sits on
    // this path only, and reads a mask rather than dividing, so that a block with a slot runs as
    // it does without ranks (the same registers: the kernels' spills are unchanged).
    if (a.held != nullptr && a.held[e] == 0) return nullptr;
    __trap();  // the host uploads every processed expert first
  }
  *pairs = a.pairs + begin;
  *n_pairs = end - begin;
  return a.arena + int64_t(slot) * a.slot_bytes;
}

// This lane's group of G lanes, counted over the grid's x (each block kExpertWarps warps).
template <int G>
__device__ inline int64_t GridLaneGroup() {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  return (int64_t(blockIdx.x) * kExpertWarps + warp) * (32 / G) + lane / G;
}

// Pairs g .. g + NT - 1 of a group, -1 past its end (through L2, as GroupExpert's reads).
template <int NT>
__device__ inline void PairRun(const int32_t* pairs, int g, int n_pairs, int (&pair)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) pair[t] = g + t < n_pairs ? __ldcg(pairs + g + t) : -1;
}

// The R x NT dot products of rows (warp_dot.cuh's GroupDots) with the activation rows of the
// group's pairs g .. g + NT - 1 (*pair: -1 past the group's end), the rows staged in shared memory
// first where stage_act (StageActRows; the kernel's launch gives the bytes). per_row: k where a
// pair is token * k + choice and the activations are the tokens' (gate, up); 1 where they are the
// pairs' own rows (down).
template <int kType, int R, int NT>
__device__ inline void PairRunDots(const RowRef (&rows)[R], int64_t cols, const int32_t* pairs, int g, int n_pairs,
                                   int per_row, const DevAct& act, bool stage_act, int (&pair)[NT],
                                   float (&acc)[R][NT]) {
  PairRun(pairs, g, n_pairs, pair);
  const int64_t row_bytes = ActRowBytes(act.type, act.stride);
  const uint8_t* act_rows[NT];
  const float* act_scales[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int64_t row = pair[t] / per_row;
    act_rows[t] = pair[t] >= 0 ? act.data + row * row_bytes : nullptr;
    act_scales[t] = pair[t] >= 0 && kType == kDevQ8_0 ? act.scales + row * (act.stride / 32) : nullptr;
  }
  if (stage_act) {
    extern __shared__ uint4 pair_run_act[];
    if (g > 0) __syncthreads();  // the previous run's rows may still be read
    StageActRows<kType, NT>(pair_run_act, act_rows, act_scales, cols);
  }
  GroupDots<kType, R, NT, NT == 1 ? 8 : 2>(rows, cols, act_rows, act_scales, acc);
}

// The same for the block types (kquant_dot.cuh's BlockGroupDots over cols / kBlockElems blocks).
template <int kType, int R, int NT>
__device__ inline void PairRunBlockDots(const KQuantRowRef (&rows)[R], int64_t cols, const int32_t* pairs, int g,
                                        int n_pairs, int per_row, const DevAct& act, int (&pair)[NT],
                                        float (&acc)[R][NT]) {
  PairRun(pairs, g, n_pairs, pair);
  KQuantActRef acts[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acts[t] = pair[t] >= 0 ? BlockAct<kType>(act, pair[t] / per_row) : KQuantActRef{};
  BlockGroupDots<kType, R, NT, NT == 1 ? 4 : 2>(rows, cols / kBlockElems<kType>, acts, act.stride, acc);
}

}  // namespace mer::cuda
