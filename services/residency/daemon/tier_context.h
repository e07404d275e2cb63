// What mer-residency's loop (residency_daemon.h) shares with its two tiers (ram_tier.h,
// vram_tier.h): the store, the segment and its residency endpoint, the clock, the counters and the
// completions waiting for ring space; and what needs both tiers at once: an expert's table entry
// (its RAM and VRAM placements are one write) and whether any demand waits.
//
// Thread-safety: the loop's thread only.
#pragma once

#include <cstdint>
#include <deque>

#include "absl/status/status.h"
#include "common/base/clock.h"
#include "common/shm/client.h"
#include "common/shm/segment.h"
#include "common/store/expert_store.h"
#include "services/residency/daemon/residency_counters.h"

namespace mer::residency {

class RamTier;
class VramTier;

class TierContext {
 public:
  // `segment` and `clock` outlive the context.
  TierContext(const ExpertStore& store, shm::ShmSegment* segment, const Clock& clock);

  const ExpertStore& store;
  shm::ShmSegment* const segment;
  shm::ResidencyEndpoint ep;
  const Clock& clock;
  const uint32_t n_layer, n_expert;
  ResidencyCounters c;  // the loop publishes a copy (ResidencyDaemon::Snapshot)
  // The tiers, set once by the loop that owns them, before either is used.
  RamTier* ram = nullptr;
  VramTier* vram = nullptr;

  // Experts are numbered layer * n_expert + expert.
  uint32_t Index(uint32_t layer, uint32_t expert) const { return layer * n_expert + expert; }
  uint32_t LayerOf(uint32_t index) const { return index / n_expert; }
  uint32_t ExpertOf(uint32_t index) const { return index % n_expert; }

  // Queues the Completion of demand `d` (FlushCompletions pushes it). `arrival_ns` is when a
  // demand that missed was popped (its stall is counted when the completion is pushed), else 0.
  void Complete(const shm::DemandRequest& d, uint32_t slot, uint64_t generation, absl::StatusCode code,
                int64_t arrival_ns = 0, shm::Pool pool = shm::Pool::kRam);
  // Pushes queued completions while the ring has room; the rest wait for the next call.
  void FlushCompletions();
  bool completions_waiting() const { return !out_.empty(); }
  // Writes expert `index`'s entry from both tiers' state: its RAM slot while resident there, its
  // VRAM slot (and fill) while resident there. Returns the entry's generation.
  uint64_t PublishEntry(uint32_t index);
  // The generation of the entry of resident expert `index`, which names it in `pool` at `slot`.
  // Only this process writes entries: one that does not read back so was overwritten in the
  // shared mapping, and is written again from the tiers' state.
  uint64_t ResidentGeneration(uint32_t index, shm::Pool pool, uint32_t slot);
  // Whether a demand waits: queued by either tier, or still in the demand ring.
  bool DemandWaiting();

 private:
  std::deque<shm::Completion> out_;
  std::deque<int64_t> out_arrival_ns_;  // parallel to out_: demand pop time of a miss, or 0
};

}  // namespace mer::residency
