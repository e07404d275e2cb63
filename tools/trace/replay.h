// Replays a routing trace against an expert cache of a given number of slots, a replacement policy
// and optionally a prefetcher (mer-residency's own, services/residency/policy/), and models what
// it would cost to serve the misses from NVMe.
//
// The model of the tier: one global pool of `slots` expert slots over all layers. For each record
// (engine batch) and each layer in order, the distinct experts the batch routes to at that layer
// are looked up (the engine acquires a layer's distinct experts in one call); those experts are
// pinned while the layer runs. A hit touches the key; a miss reads the expert (expert_bytes) and
// admits it, evicting the policy's victim among unpinned keys; when every resident key is pinned
// (slots < distinct experts of one layer) the expert is read without being cached ("bypassed").
//
// Prefetch (decode records only; a prompt chunk touches most experts anyway): after layer l of a
// decode token, the predictor (services/residency/policy/prefetch_predictor.h, trained online on
// everything replayed so far, never on the future) names the experts expected at layer l+1 (layer
// 0 of the next token after the last layer). Those of confidence >= `confidence` that are not
// resident are read, at most `prefetch_budget` per layer step, each into a free slot or the slot
// of a victim that is
//   - not pinned (demand goes first: a prefetch never evicts an expert of the layer in flight),
//   - not named by the same prediction, nor prefetched in the same step,
//   - of another layer than the one the prefetch is for, when the policy can name such a victim
//     (the target layer's experts are resident because that layer used them lately, and in
//     recency order the oldest keys are exactly the next layer's: evicting them for a guess at
//     the same layer loses more often than it wins); else one of the target layer's.
// The policy admits it with AdmitPrefetched (at its eviction end until used). A prefetched expert
// is useful when a demand lookup hits it before it is evicted, wasted when evicted (or left at the
// end) unused. Prefetch reads are assumed to overlap compute; only demand misses stall.
//
// Stall model: each demand miss costs latency_us plus expert_bytes / bandwidth (GB/s, 1e9 bytes).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/residency/policy/prefetch_predictor.h"
#include "tools/trace/routing_trace.h"

namespace mer::trace {

struct ReplayOptions {
  int64_t slots = 0;  // >= 1
  // "lru", "lfu", "arc", or "opt": Belady's MIN, which reads the future from the trace (no prefetch),
  // the fewest misses any policy can have with these slots.
  std::string policy = "lru";
  bool prefetch = false;
  double confidence = 0.3;      // prefetch threshold on the predictor's confidence
  int32_t prefetch_budget = 0;  // prefetch reads per layer step; 0 = the trace's top_k
  residency::PrefetchPredictorOptions predictor;
  int64_t expert_bytes = 0;     // 0 = the trace's header value
  double bandwidth_gbps = 1.5;  // NVMe read bandwidth, GB/s
  double latency_us = 100;      // per read
  bool count_prompt = true;     // false: prompt records warm the cache but are not counted
};

struct ReplayStats {
  int64_t slots = 0;
  int64_t expert_bytes = 0;
  int64_t tokens = 0;   // counted tokens
  int64_t lookups = 0;  // distinct (layer, expert) per batch and layer
  int64_t hits = 0;
  int64_t misses = 0;        // lookups - hits
  int64_t bypassed = 0;      // misses served without caching (every slot pinned)
  int64_t demand_bytes = 0;  // misses x expert_bytes
  int64_t prefetch_issued = 0;
  int64_t prefetch_useful = 0;
  int64_t prefetch_wasted = 0;  // issued - useful (evicted or left unused)
  int64_t prefetch_bytes = 0;
  double stall_seconds = 0;  // modelled foreground stall of the demand misses

  double hit_rate() const { return lookups > 0 ? static_cast<double>(hits) / lookups : 0.0; }
  int64_t bytes_read() const { return demand_bytes + prefetch_bytes; }
};

// Slots for a fraction (0, 1] of all n_layer x n_expert experts, rounded, at least 1.
int64_t SlotsForFraction(const TraceGeometry& geometry, double fraction);

// InvalidArgument for bad options (unknown policy, slots < 1, no expert size known, ...).
absl::StatusOr<ReplayStats> Replay(const RoutingTrace& trace, const ReplayOptions& options);

}  // namespace mer::trace
