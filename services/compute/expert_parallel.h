// Expert parallelism: a step's routed experts split over N ranks, each of which computes the whole
// dense part (attention, router, norms) and only the experts placed on it (docs/design.md, "Several
// GPUs and several hosts").
//
// The rule that keeps results equal to one rank's: a rank writes the output of every (token, slot)
// pair it runs, unweighted, into the layer's [tokens, k, n_embd] buffer and zeros into the rest;
// the ranks then sum that buffer elementwise (an all-reduce); each element has one non-zero term at
// most, so the sum is that term exactly, whatever order the reduction adds in; and every rank
// combines the k outputs of each token in top-k order as one rank does. Outputs are exchanged per
// expert, not pre-summed, because pre-summing would change the order of the additions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mer {

// Which experts a rank holds and which rank runs each (token, expert) pair of a step. Expert e of
// every layer is placed on rank e mod n_ranks; a replicated expert (a hot one) is held by every
// rank. Its pairs go, in pair order, each to the holder with the fewest pairs of the layer so far
// (ties to the lower rank), after every pair of a placed-once expert went to its owner: the
// ranks' loads even out, and every rank, computing from the same routing, assigns alike.
class ExpertPlacement {
 public:
  // InvalidArgument unless 1 <= n_ranks and 0 <= rank < n_ranks.
  static absl::StatusOr<ExpertPlacement> Create(int n_ranks, int rank);

  int n_ranks() const { return n_ranks_; }
  int rank() const { return rank_; }

  // Places (layer, expert) on every rank. Every rank of a group must replicate the same experts,
  // and change them only between steps.
  void Replicate(int layer, int expert) { replicated_.insert({layer, expert}); }
  void ClearReplicas() { replicated_.clear(); }
  size_t replicas() const { return replicated_.size(); }
  bool IsReplicated(int layer, int expert) const {
    return !replicated_.empty() && replicated_.count({layer, expert}) != 0;
  }

  // Whether this rank's arena holds (layer, expert).
  bool Holds(int layer, int expert) const { return IsReplicated(layer, expert) || expert % n_ranks_ == rank_; }
  // How many of a layer's n_expert experts are placed on this rank, replicas aside: the e with
  // e mod n_ranks == rank, ceil((n_expert - rank) / n_ranks) (0 where rank >= n_expert).
  int OwnedExperts(int n_expert) const { return n_expert > rank_ ? (n_expert - rank_ + n_ranks_ - 1) / n_ranks_ : 0; }
  // runners[i] = the rank that runs pair i of a layer's routing `experts` (pair i is token i / k's
  // slot i % k), for every pair. `load` (n_ranks entries) is scratch, left holding each rank's
  // pairs: the caller owns it, so that a step allocates nothing.
  void AssignRunners(int layer, absl::Span<const int32_t> experts, absl::Span<int32_t> runners,
                     absl::Span<int64_t> load) const;

 private:
  ExpertPlacement(int n_ranks, int rank) : n_ranks_(n_ranks), rank_(rank) {}

  int n_ranks_ = 1;
  int rank_ = 0;
  std::set<std::pair<int, int>> replicated_;
};

// Which experts a group replicates, chosen from the routing it serves: each layer's `per_layer`
// experts with the most pairs, counted over the steps since the last choice plus half the counts
// before it (so the choice follows a workload that drifts). Ties go to the lower expert; an expert
// never routed to is never chosen. The same routings give the same choice.
class HotExpertCounter {
 public:
  HotExpertCounter(int n_layer, int n_expert);
  // A layer's routing of one step: the chosen experts of every token (ids in [0, n_expert)).
  void Count(int layer, absl::Span<const int32_t> experts);
  // Each layer's `per_layer` most counted experts as (layer, expert), layer by layer; then halves
  // every count.
  std::vector<std::pair<int, int>> ChooseAndAge(int per_layer);

 private:
  const int n_layer_, n_expert_;
  std::vector<double> pairs_;  // [n_layer, n_expert]
};

// The exchange between the ranks of a group: one call per MoE layer of every step, made by every
// rank in the same order with the same count.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  // Replaces values[i] on every rank with the sum over the ranks of their values[i], i < count.
  // An error once the group has failed (Fail, or a rank gone): the step cannot complete.
  virtual absl::Status SumAcrossRanks(float* values, size_t count) = 0;
  // Called by a rank that cannot reach its next exchange (its expert source failed, say): the other
  // ranks' waiting exchanges, and every later one, return `why`. A group that failed stays failed,
  // as an aborted NCCL communicator does: the ranks make a new group.
  virtual void Fail(const absl::Status& why) = 0;
};

// The exchanges of a group's ranks, as a whole: what ExpertParallelBackend needs of a group,
// whichever side its ranks sum on. Each group hands out its ranks' sides itself (rank(r)): the
// host's ExpertExchange (the CPU's InProcessExchangeGroup, cpu/in_process_exchange.h) or the
// device's (NCCL, cuda/nccl_exchange.h).
class ExpertExchangeGroup {
 public:
  virtual ~ExpertExchangeGroup() = default;
  virtual int n_ranks() const = 0;
  // Clears a failure, once every rank has returned from the step that failed, so that the ranks
  // take the next step together.
  virtual void Reset() = 0;
};

}  // namespace mer
