// How evenly expert parallelism (services/compute/expert_parallel.h) spreads a trace's expert work
// over N ranks. Every layer of every counted record assigns its (token, expert) pairs as the ranks
// would (ExpertPlacement: experts e mod N, and the `replicate_per_layer` experts of each layer that
// the trace uses most on every rank); the ranks exchange at the end of each layer, so a layer's
// expert time is its busiest rank's. Counting a pair as one unit of work (at batch 1 a pair is one
// expert's weights read), the expert part of a step runs pairs / busiest times faster than on one
// rank, and each rank works pairs / (N x busiest) of the time.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "tools/trace/routing_trace.h"

namespace mer::trace {

struct RankLoadOptions {
  int n_ranks = 2;              // >= 1
  int replicate_per_layer = 0;  // the most used experts of each layer (over the whole trace) held by every rank
  bool count_prompt = false;    // false: decode records only (batch-1 decode is what the split is for)
};

struct RankLoadStats {
  int n_ranks = 0;
  int64_t layer_steps = 0;    // (record, layer) counted
  int64_t pairs = 0;          // their (token, expert) pairs
  int64_t busiest_pairs = 0;  // summed over layer steps: the busiest rank's pairs

  // Of the expert work, one rank's time over the group's.
  double speedup() const { return busiest_pairs > 0 ? static_cast<double>(pairs) / busiest_pairs : 1.0; }
  double efficiency() const { return n_ranks > 0 ? speedup() / n_ranks : 0.0; }
};

// InvalidArgument for n_ranks < 1, a negative replication or one above n_expert.
absl::StatusOr<RankLoadStats> RankLoad(const RoutingTrace& trace, const RankLoadOptions& options);

}  // namespace mer::trace
