// A ComputeBackend made of N expert-parallel ranks in one process (expert_parallel.h): every call
// runs on every rank at once with the same batch, rank 0 on the caller's thread and rank r > 0 on
// a thread of its own; every rank computes the same logits, and rank 0's are the answer.
//
// One process driving the ranks rather than a process per rank: the ranks must take every step
// together with the same batch, which one batcher gives for free, where a process per rank would
// need a leader that sends each step's batch to the others before it can run.
//
// A step that fails on one rank fails on every rank (the rank fails the group's exchange, and the
// others' exchanges return its error); the group is reset once all have returned, so the next
// step runs on all of them again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/expert_source.h"
#include "services/compute/backend.h"
#include "services/compute/expert_parallel.h"

namespace mer {

class ExpertParallelBackend final : public ComputeBackend {
 public:
  // What the ranks were made with, kept alive as long as they are: rank r's placement and its side
  // of the exchange group, and the expert sources the group owns (those of ranks > 0, say).
  struct Group {
    std::vector<std::unique_ptr<ExpertSource>> sources;
    std::vector<std::unique_ptr<ExpertPlacement>> placements;
    std::unique_ptr<ExpertExchangeGroup> exchange;
  };

  // ranks[r] computes with group.placements[r] and group.exchange->rank(r). InvalidArgument unless
  // there are as many ranks as placements and exchange ranks, all of one geometry and sizes.
  static absl::StatusOr<std::unique_ptr<ExpertParallelBackend>> Create(
      Group group, std::vector<std::unique_ptr<ComputeBackend>> ranks);
  ~ExpertParallelBackend() override;

  int n_ranks() const { return static_cast<int>(ranks_.size()); }

  const ModelConfig& config() const override { return ranks_[0]->config(); }
  int max_batch_tokens() const override { return ranks_[0]->max_batch_tokens(); }
  int max_sequences() const override { return ranks_[0]->max_sequences(); }
  int max_context_tokens() const override { return ranks_[0]->max_context_tokens(); }

  absl::Status Forward(absl::Span<const BatchToken> batch, float* logits) override;
  absl::Status ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) override;
  void ClearSequence(int sequence) override;
  int32_t sequence_length(int sequence) const override { return ranks_[0]->sequence_length(sequence); }

  // Rank 0's routing: every rank computes the same.
  void set_routing_observer(RoutingObserver* observer) override { ranks_[0]->set_routing_observer(observer); }
  // Unimplemented (but nullptr): each rank would call a RouteOverride for every layer, where it
  // expects one call per layer of a step.
  absl::Status set_route_override(RouteOverride* route) override;
  // Rank 0's counters, the experts' pairs, lookups, misses, uploads and evictions summed over the
  // ranks (each rank computes and looks up only the experts it runs).
  BackendCounters counters() const override;
  std::vector<BackendCounters> rank_counters() const override;
  std::string KernelProfile() const override { return ranks_[0]->KernelProfile(); }

 private:
  ExpertParallelBackend(Group group, std::vector<std::unique_ptr<ComputeBackend>> ranks);

  // Runs work(rank) on every rank at once and returns rank 0's status, else the first failing
  // rank's; resets the group's exchange after a failure.
  absl::Status OnEveryRank(absl::FunctionRef<absl::Status(int)> work);
  void Worker(int rank);

  Group group_;  // before ranks_, so that it outlives them
  std::vector<std::unique_ptr<ComputeBackend>> ranks_;
  std::vector<int32_t> scratch_ids_;  // ranks > 0: the ids of ForwardArgmax, max_batch_tokens each

  std::mutex mu_;
  std::condition_variable cv_;
  const absl::FunctionRef<absl::Status(int)>* work_ = nullptr;  // the call every worker is to run
  uint64_t generation_ = 0;                                     // calls handed to the workers
  int running_ = 0;                                             // workers yet to finish this call
  bool stopping_ = false;
  std::vector<absl::Status> results_;
  std::vector<std::thread> workers_;
};

}  // namespace mer
