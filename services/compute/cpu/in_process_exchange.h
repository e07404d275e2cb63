// ExpertExchange between ranks that are threads of one process: the CPU reference of expert
// parallelism (services/compute/expert_parallel.h), where each rank's CpuEngine runs on a thread of
// its own. A GPU group exchanges through NCCL instead; this one only shares memory.
//
// SumAcrossRanks waits until every rank has posted its buffer, adds the buffers in rank order into
// one sum (the last rank to arrive does), and returns once the caller's buffer holds it. The next
// exchange starts only after every rank has taken the last sum.
//
// Thread-safety: each rank's exchange is called by that rank's thread; the group outlives them.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "services/compute/expert_parallel.h"

namespace mer {

class InProcessExchangeGroup final : public ExpertExchangeGroup {
 public:
  explicit InProcessExchangeGroup(int n_ranks);
  ~InProcessExchangeGroup() override;
  InProcessExchangeGroup(const InProcessExchangeGroup&) = delete;
  InProcessExchangeGroup& operator=(const InProcessExchangeGroup&) = delete;

  int n_ranks() const override { return static_cast<int>(ranks_.size()); }
  // Rank r's side of the exchange, owned by the group.
  ExpertExchange& rank(int r);
  void Reset() override;

 private:
  class Rank;

  absl::Status SumAcrossRanks(int rank, float* values, size_t count);
  void Fail(const absl::Status& why);

  std::vector<std::unique_ptr<Rank>> ranks_;
  std::mutex mu_;
  std::condition_variable cv_;
  absl::Status failed_;               // OK until a rank fails the group
  std::vector<const float*> posted_;  // [rank] buffers of the exchange being gathered
  size_t count_ = 0;                  // their length
  int arrived_ = 0;                   // ranks that posted to the exchange being gathered
  int departing_ = 0;                 // ranks yet to take the last sum
  uint64_t generation_ = 0;           // exchanges summed so far
  std::vector<float> sum_;
};

}  // namespace mer
