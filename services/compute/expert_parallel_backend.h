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
//
// Hot experts (HotExpertReplication): expert e mod N leaves the rank that owns a layer's most used
// experts with more than its share of the pairs, and a layer's expert time is its busiest rank's.
// With per_layer > 0 the backend counts rank 0's routing (every rank computes the same) and, every
// `every_calls` calls, makes each layer's most used experts replicas on every rank, whose pairs
// then go to the least loaded ranks (ExpertPlacement); the results stay bit for bit those of one
// engine whatever is replicated (expert_parallel.h's rule).
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

// Which experts every rank of an ExpertParallelBackend holds besides its own: each layer's
// per_layer most used (0: none), chosen again every every_calls calls of Forward or ForwardArgmax.
struct HotExpertReplication {
  int per_layer = 0;
  int every_calls = 64;
};

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
  // there are as many ranks as placements and exchange ranks, all of one geometry and sizes, and
  // the replication is in range (per_layer <= n_expert, every_calls >= 1).
  static absl::StatusOr<std::unique_ptr<ExpertParallelBackend>> Create(
      Group group, std::vector<std::unique_ptr<ComputeBackend>> ranks, HotExpertReplication replication = {});
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
  void set_routing_observer(RoutingObserver* observer) override;
  // Unimplemented (but nullptr): each rank would call a RouteOverride for every layer, where it
  // expects one call per layer of a step.
  absl::Status set_route_override(RouteOverride* route) override;
  // Rank 0's counters (busiest_rank_pairs is the same on every rank), the experts' pairs, lookups,
  // misses, uploads and evictions summed over the ranks (each rank computes and looks up only the
  // experts it runs).
  BackendCounters counters() const override;
  std::vector<BackendCounters> rank_counters() const override;
  std::string KernelProfile() const override { return ranks_[0]->KernelProfile(); }

  // The experts replicated now, over all layers (the same on every rank).
  size_t replicas() const { return group_.placements[0]->replicas(); }

 private:
  ExpertParallelBackend(Group group, std::vector<std::unique_ptr<ComputeBackend>> ranks,
                        HotExpertReplication replication);

  // Rank 0's routing observer while experts are replicated: counts the routing, then passes it on.
  class HotExpertObserver final : public RoutingObserver {
   public:
    explicit HotExpertObserver(HotExpertCounter& counter) : counter_(counter) {}
    void OnRouting(int layer, absl::Span<const int32_t> experts_per_token, int k) override;
    RoutingObserver* next = nullptr;  // the observer set on the backend

   private:
    HotExpertCounter& counter_;
  };
  // After a call: every replication_.every_calls calls, the replicas chosen again on every rank.
  void MaybeReplicate();

  // Runs work(rank) on every rank at once and returns rank 0's status, else the first failing
  // rank's; resets the group's exchange after a failure.
  absl::Status OnEveryRank(absl::FunctionRef<absl::Status(int)> work);
  void Worker(int rank);

  Group group_;  // before ranks_, so that it outlives them
  std::vector<std::unique_ptr<ComputeBackend>> ranks_;
  std::vector<int32_t> scratch_ids_;  // ranks > 0: the ids of ForwardArgmax, max_batch_tokens each
  const HotExpertReplication replication_;
  HotExpertCounter hot_;
  HotExpertObserver hot_observer_{hot_};
  uint64_t calls_ = 0;

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
