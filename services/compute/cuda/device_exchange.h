// The exchange of expert-parallel ranks that sum on their GPUs (expert_parallel.h's rule): each
// MoE layer's expert outputs are summed over the ranks in place in device memory, by work enqueued
// on the rank's stream, so that a step captured into a CUDA graph captures the exchange too
// (NcclExchangeGroup, nccl_exchange.h). The host's ExpertExchange is the other kind: it sums host
// buffers, so the step synchronises around it.
//
// This header exposes no CUDA types: a stream is passed as the pointer a cudaStream_t is.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;  // cudaStream_t is a CUstream_st*

namespace mer {

class DeviceExpertExchange {
 public:
  virtual ~DeviceExpertExchange() = default;
  // Enqueues on `stream` (of this rank's device) the replacement of device_values[i], i < count,
  // with the sum over the ranks of their device_values[i]. Every rank makes the same calls, in the
  // same order, with the same count. An error, with nothing enqueued, once the group has failed.
  virtual absl::Status EnqueueSum(float* device_values, size_t count, CUstream_st* stream) = 0;
  // Called by a rank that cannot reach its next exchange: the sums that other ranks enqueued and
  // wait on are abandoned (they finish with meaningless values), and every later EnqueueSum and
  // status() returns `why` until the group is reset.
  virtual void Fail(const absl::Status& why) = 0;
  // OK unless the group failed. A rank checks it after its step's synchronisation: a sum the
  // failure abandoned completed without an error of its own.
  virtual absl::Status status() const = 0;
  // Changes whenever the group makes its exchange anew (a reset after a failure): work captured
  // into a CUDA graph under an earlier generation must be captured again.
  virtual uint64_t generation() const = 0;
};

}  // namespace mer
