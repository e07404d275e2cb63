// The device's hit-or-miss decision of one layer (the served path with a partial arena, docs/
// cuda.md "Misses decided on the device"): after the routing kernels have grouped the layer's
// experts, one block writes a RoutingRecord (routing_record.h) of the layer's used experts (and,
// on decode steps, the look-ahead's predicted ones) into the host-mapped record ring that the
// engine's miss service reads, and, when every used expert is in the arena, opens the layer's
// gate itself; otherwise the miss service opens it once it has placed the missing ones. The step
// waits on the gate (a stream memory operation) before the expert kernels, so no host thread
// blocks between layers. n_expert <= 1024, k <= 32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "services/compute/cuda/moe_group.cuh"

namespace mer::cuda {

struct MissPostArgs {
  MoeGroups groups;                 // the layer's, written by the routing kernels
  const int32_t* slot_table;        // the layer's row [n_expert]
  const int32_t* pred_chosen;       // int32 [k]: the look-ahead's prediction for layer + 1, or null
  const uint32_t* step;             // the step's number (a step input)
  unsigned long long* record_head;  // device: records posted so far (advanced by one per post)
  uint8_t* ring;                    // host-mapped: ring_capacity records of record_bytes
  int32_t ring_capacity;
  int32_t record_bytes;
  uint32_t* gate;  // device: the layer's gate, set to 1 here when nothing misses
  int32_t layer, n_expert, k;
};

void LaunchMissPost(const MissPostArgs& args, cudaStream_t stream);

}  // namespace mer::cuda
