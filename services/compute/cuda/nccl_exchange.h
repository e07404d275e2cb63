// The device exchange of N expert-parallel ranks in one process, each on a GPU of its own
// (docs/design.md, "Several GPUs and several hosts"): one NCCL communicator per device
// (ncclCommInitAll), and per MoE layer an in-place ncclAllReduce (f32, ncclSum) of the layer's
// [tokens, k, n_embd] expert outputs on the rank's stream. Each element has at most one non-zero
// term over the ranks (expert_parallel.h), so NCCL's reduction order gives that term exactly.
// NCCL refuses two ranks on one device ("Duplicate GPU detected"): ranks that share a GPU exchange
// on the host instead (an ExpertExchange, CudaEngineOptions::host_exchange).
//
// Failure: Fail marks the group failed and aborts every communicator (ncclCommAbort), so that a
// rank whose stream waits in an all-reduce for a rank that will never join it finishes; Reset,
// once every rank has returned, makes new communicators under a new generation, and the ranks
// capture their graphs again (a graph keeps the communicator it was captured with). Where NCCL
// cannot make them, the group stays failed with that error.
//
// Thread-safety: rank r's EnqueueSum is called by rank r's thread, Fail by any rank's thread,
// status and generation by any; Reset only while no rank is inside a step. Each rank's
// communicator is guarded by a mutex of its own that only Fail contends for, so that Fail never
// aborts a communicator in the middle of an enqueue; failed_ by mu_, with failed_flag_ read
// without it on the step's path (release by Fail and Reset, acquire by the readers).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/compute/cuda/device_exchange.h"
#include "services/compute/expert_parallel.h"

struct ncclComm;  // ncclComm_t is an ncclComm*

namespace mer::cuda {
struct NcclApi;
}  // namespace mer::cuda

namespace mer {

class NcclExchangeGroup final : public ExpertExchangeGroup {
 public:
  // Communicators over `devices` (CUDA ordinals, rank r on devices[r]), checked with one sum of
  // each rank's 1.0. InvalidArgument for an empty list, a device out of range or a repeated one;
  // Unavailable, with NCCL's message, when NCCL cannot make the group.
  static absl::StatusOr<std::unique_ptr<NcclExchangeGroup>> Create(std::vector<int> devices);
  ~NcclExchangeGroup() override;
  NcclExchangeGroup(const NcclExchangeGroup&) = delete;
  NcclExchangeGroup& operator=(const NcclExchangeGroup&) = delete;

  int n_ranks() const override { return static_cast<int>(devices_.size()); }
  // Rank r's side of the exchange, owned by the group.
  DeviceExpertExchange& rank(int r);
  void Reset() override;

 private:
  class Rank;
  struct Comm {
    std::mutex mu;
    ncclComm* comm ABSL_GUARDED_BY(mu) = nullptr;  // null once Fail aborted it
  };

  NcclExchangeGroup(const cuda::NcclApi* nccl, std::vector<int> devices);
  // Makes every rank's communicator and checks it with one sum.
  absl::Status MakeCommunicators();
  absl::Status EnqueueSum(int rank, float* values, size_t count, CUstream_st* stream);
  void Fail(const absl::Status& why);
  absl::Status status() const;

  const cuda::NcclApi* const nccl_;  // loaded at Create (nccl_api.h)
  const std::vector<int> devices_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::unique_ptr<Comm>> comms_;  // [rank]
  mutable std::mutex mu_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // OK until the group fails
  std::atomic<bool> failed_flag_{false};      // !failed_.ok()
  std::atomic<uint64_t> generation_{0};       // communicators made so far, less one
};

}  // namespace mer
