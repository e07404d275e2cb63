// ResidencyOptions: every limit and switch of mer-residency's loop and its two tiers, each with its
// default (mer-residency's flags set a few of them).
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace mer::residency {

struct ResidencyOptions {
  // RAM tier size: the slot count is ram_budget_bytes / blob_bytes, at least min_ram_slots.
  uint64_t ram_budget_bytes = uint64_t{1} << 30;
  // Floor on the RAM slot count (and 1 is the floor of the floor). The engine acquires a layer's
  // experts in groups of at most half the slots, so any count serves any batch.
  uint32_t min_ram_slots = 0;
  // Replacement policy of the RAM tier: "lru", "lfu" or "arc".
  std::string policy = "lru";
  // Blob reads in flight at once (demand and prefetch together); also the IoEngine queue depth.
  int io_inflight_max = 16;
  // Read ahead from hints (predictor + predicted hints).
  bool prefetch = false;
  // Prefetch reads in flight at once (a part of io_inflight_max).
  int prefetch_inflight_max = 2;
  // Warm the RAM tier: while no demand waits, read the store's experts (layer by layer) into free
  // RAM slots until none is left, io_inflight_max - 2 reads at a time, so that the first requests
  // do not wait for the disk. Only free slots: warming evicts nothing.
  bool warm = false;
  // The share of the experts this instance serves when it is one expert-parallel rank's
  // (mer-compute --expert-ranks, the rank's own instance): expert e of every layer is the share of
  // rank e mod expert_share_ranks, as ExpertPlacement places it. Warming reads only the share; a
  // demand for another expert (a replicated one) is served all the same. 1: every expert.
  int expert_share_ranks = 1;
  int expert_share_rank = 0;
  // Predictions below this confidence (0..1) are not prefetched.
  double prefetch_threshold = 0.5;
  // Most experts prefetched per hint.
  int prefetch_max_per_hint = 4;
  // How many layers past the hinted one to predict and prefetch. 1 is the next layer only; a
  // layer computes in about the time one blob read takes, so a read for the very next layer is
  // mostly late, and looking further ahead gives reads time to land.
  int prefetch_lookahead_layers = 2;
  // Reads of a blob again after a checksum mismatch or a read error before failing the load.
  int max_refetches = 2;
  // Heartbeat period of the residency role.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  // Longest sleep of the idle loop (demand ring futex, or the engine's Wait) before re-checking.
  absl::Duration idle_wait = absl::Milliseconds(2);
  // Print the counters to stderr this often from Run; zero = never.
  absl::Duration stats_interval = absl::ZeroDuration();
  // VRAM tier (the arena compute exports through CUDA IPC; docs/cuda.md). RAM -> VRAM copies in
  // flight at once, demand and prefetch together.
  int vram_upload_inflight_max = 4;
  // Move predicted experts (compute's predicted hints, and the predictor's when prefetch is on)
  // from RAM into free or least recently used unpinned VRAM slots while no demand waits.
  bool vram_prefetch = true;
  // Of vram_upload_inflight_max, at most this many copies are prefetches (demand keeps the rest).
  // Three keep the link busy while a layer computes: at 25% of the 30B geometry's experts in VRAM
  // one stream decoded at an ITL p50 of 9.97 ms against 10.61 ms with one (docs/benchmarks.md).
  int vram_prefetch_inflight_max = 3;
  // Predictions below this confidence (0..1) are not moved into VRAM.
  double vram_prefetch_threshold = 0.5;
  // How the RAM tier relates to the VRAM arena: "inclusive" (an expert in VRAM keeps its RAM
  // copy), "exclusive" (RAM holds what VRAM does not: an expert's RAM copy goes once it is in
  // VRAM, and an expert evicted from VRAM is copied back into RAM in the arena's device layout,
  // so that the two budgets add up), or "auto": exclusive while the RAM tier cannot hold every
  // expert.
  std::string tiers = "auto";
  // CHECK the loop's bookkeeping (slot owners, the free list, loads and copies in flight, the
  // policy's keys, VRAM placements against the slot map) at every census: O(experts + slots) a
  // census. Tests turn it on.
  bool check_invariants = false;
};

// Whether `expert` (of any layer) is in the instance's share (ResidencyOptions::expert_share_*).
inline bool InExpertShare(const ResidencyOptions& o, uint32_t expert) {
  return static_cast<int>(expert % static_cast<uint32_t>(o.expert_share_ranks)) == o.expert_share_rank;
}
// How many of a layer's n_expert experts are in the share.
inline uint32_t ShareExpertsPerLayer(const ResidencyOptions& o, uint32_t n_expert) {
  const uint32_t ranks = static_cast<uint32_t>(o.expert_share_ranks), rank = static_cast<uint32_t>(o.expert_share_rank);
  return rank < n_expert ? (n_expert - rank + ranks - 1) / ranks : 0;
}

}  // namespace mer::residency
