// mer-residency's RAM tier: the segment's pool of blob-sized RAM slots, which expert each holds,
// the replacement policy that picks victims among the unpinned ones, and the blob reads that fill
// them through the IoEngine. The loop (residency_daemon.h) drives it, in its turn's order:
//   HandleDemand  a RAM DemandRequest: a resident expert completes at once (a hit); a miss joins
//                 the load already queued or in flight (duplicate demands are coalesced: one read,
//                 one completion per request) or queues one;
//   StartLoads    queued loads while fewer than io_inflight_max reads are in flight, each into a
//                 slot no step can read: a free one, or the policy's victim among the unpinned
//                 residents, evicted with the R1-R3 protocol of common/shm/residency_table.h; one
//                 read of blob_bytes() at BlobOffset into the slot;
//   Reap          read completions: the blob's CRC is checked (ExpertStore::VerifyBlob); a
//                 mismatch or read error is counted and the blob read again up to max_refetches
//                 times, after which the waiters get the error (DataLoss naming the expert for a
//                 bad checksum) and the entry is marked failed: corrupted bytes are never
//                 published. A good blob is published and its waiters completed;
//   Prefetch      a predicted expert read ahead, into a free or unpinned slot only.
//
// An expert's RAM state: kAbsent -> kQueued (a demand or the VRAM tier wants it) -> kLoading (its
// read in flight) -> kResident (published) -> kAbsent (evicted, or its load failed); a prefetch
// goes from kAbsent to kLoading directly. A resident expert is never evicted while a compute step
// pins its slot, a copy into VRAM reads it (HoldForCopy), or a demanded upload waits to read it
// (VramState::kQueued).
//
// Exclusive tiers (ResidencyOptions::tiers): the RAM tier holds what the VRAM arena does not. An
// expert's RAM copy goes once a copy of it into VRAM has completed (DropAfterPromotion), and an
// expert the VRAM tier evicts comes back into a RAM slot (kAbsent -> kDemoting, its copy out of
// the arena in flight -> kResident), in the arena's device layout: such a copy only ever goes back
// into the arena (compute's table shows it as kTierRamDevice, never as a blob), and a RAM demand
// for it reads the blob again.
//
// Thread-safety: the loop's thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/io/io_engine.h"
#include "common/shm/layout.h"
#include "services/residency/daemon/residency_options.h"
#include "services/residency/daemon/tier_context.h"
#include "services/residency/policy/replacement_policy.h"

namespace mer::residency {

enum class RamState : uint8_t {
  kAbsent,    // no slot
  kQueued,    // in the queue of loads, waiting for a slot or a read (no slot yet)
  kLoading,   // its read into its slot is in flight
  kResident,  // published in its slot
  kDemoting,  // exclusive tiers: its copy out of the VRAM arena into its slot is in flight
};

class RamTier {
 public:
  // Reads blobs from `experts_fd` through `io` (both outlive the tier) into the segment's RAM slots.
  RamTier(TierContext& ctx, IoEngine& io, int experts_fd, const ResidencyOptions& options,
          std::unique_ptr<ReplacementPolicy> policy);

  uint32_t slots() const { return n_slots_; }
  // Whether the tiers are exclusive (ResidencyOptions::tiers; "auto": while the RAM tier cannot
  // hold every expert).
  bool exclusive() const { return exclusive_; }
  // Offers the slot pool to the engine as registered buffers (READ_FIXED on io_uring), in pieces
  // of at most 1 GiB cut at slot boundaries; whether the engine took them (shared memory may be
  // refused: then plain reads).
  bool RegisterBuffers();

  void HandleDemand(const shm::DemandRequest& d, int64_t now_ns);
  // Whether a load started.
  bool StartLoads();
  // Reaps the read completions there are, without waiting; an error only if the engine breaks.
  absl::Status Reap();
  void Prefetch(uint32_t layer, uint32_t expert);
  // Starts warming reads into free slots (ResidencyOptions::warm); returns whether it started
  // any. Logs what warming read once it has finished.
  bool Warm();
  // Compute pins resident experts without asking (a hit costs it no round trip), so the policy
  // learns of those uses from the table: every resident whose hit count grew is touched, oldest
  // use first, before the policy is asked for a victim. A prefetched expert hit since its load
  // counts as a useful prefetch here.
  void SyncComputeHits();
  // The slot gauges of the counters (slots_free, _resident, _pinned, _loading).
  void Census();
  // Waits up to `limit` (real time) for the reads in flight: their destinations are our slots.
  void Drain(absl::Duration limit);
  // CHECKs the tier's bookkeeping (ResidencyOptions::check_invariants).
  void CheckInvariants() const;

  // What the VRAM tier asks of an expert's RAM copy.
  RamState state(uint32_t index) const { return experts_[index].state; }
  // Its slot while resident, else shm::kNoSlot.
  uint32_t resident_slot(uint32_t index) const {
    const RamExpert& e = experts_[index];
    return e.state == RamState::kResident ? e.slot : shm::kNoSlot;
  }
  bool has_waiters(uint32_t index) const { return !experts_[index].waiters.empty(); }
  // Queues the load of an absent expert (for the VRAM tier, or for waiters it already has).
  void QueueLoad(uint32_t index);
  // A VRAM fill was demanded from the resident expert's copy: a use the policy counts. Under LFU
  // the RAM tier then keeps the experts that miss VRAM most often, not the ones VRAM holds.
  void NoteFillDemand(uint32_t index);
  // A copy into VRAM reads the resident expert's slot from HoldForCopy to ReleaseCopy: the slot
  // is not evicted meanwhile.
  void HoldForCopy(uint32_t index);
  void ReleaseCopy(uint32_t index);
  bool copying(uint32_t index) const { return experts_[index].copying; }
  // Whether the resident copy is in the arena's device layout (demoted from VRAM).
  bool device_layout(uint32_t index) const {
    return experts_[index].state == RamState::kResident && experts_[index].device_layout;
  }

  // Exclusive tiers. StartDemotion: a RAM slot for absent expert `index`, evicted from VRAM, whose
  // copy out of the arena the caller starts next (kDemoting); nullopt if no slot can be had.
  // FinishDemotion: that copy completed (the copy is published in the device layout) or failed.
  std::optional<uint32_t> StartDemotion(uint32_t index);
  void FinishDemotion(uint32_t index, bool ok);
  // A copy of resident `index` into VRAM completed: with exclusive tiers its RAM copy goes.
  void DropAfterPromotion(uint32_t index);
  // The arena closed: device-layout copies are another arena's layout, so they go.
  void DropDeviceCopies();

  bool loads_queued() const { return !queued_.empty(); }
  int reads_in_flight() const { return inflight_; }
  int reads_outstanding() const { return io_.outstanding(); }

 private:
  struct RamExpert {
    RamState state = RamState::kAbsent;
    uint32_t slot = shm::kNoSlot;  // kLoading, kResident
    bool prefetched = false;       // admitted by a prefetch, not demanded since
    bool prefetch_load = false;    // the load in flight is a prefetch
    bool copying = false;          // a copy into VRAM reads the slot
    bool device_layout = false;    // kResident: the slot holds the arena's device layout
    uint64_t hits_seen = 0;        // the entry's compute-side hit count the policy has been told of
    int attempts = 0;              // reads again after a failure, of the load in progress
    std::vector<shm::DemandRequest> waiters;
    std::vector<int64_t> waiter_arrival_ns;  // per waiter: when its demand was popped
  };
  struct TouchedExpert {
    uint64_t epoch;    // its last use by compute
    uint32_t index;    // expert index
    uint64_t touches;  // hits since the last sync, capped
  };
  static constexpr uint32_t kFreeOwner = 0xFFFFFFFFu;
  static constexpr uint64_t kMaxTouchesPerSync = 64;  // bounds the work a hostile count can cause

  std::optional<uint32_t> AllocateSlot(ExpertKey incoming, bool for_prefetch);
  // Unpublishes resident `index` and takes it out of the policy (R1-R2); its slot is free, and
  // reusable at once if this returns true (R3), else once unpinned (it joins the free list).
  bool Evict(uint32_t index);
  // Gives expert `index`'s slot back to the free list (kAbsent, no slot); nothing is published.
  void FreeSlot(uint32_t index);
  // Submits the read of `index`'s blob into its slot; kLoading once it is in flight.
  absl::Status Submit(uint32_t index);
  // The read alone (a refetch of a load in flight goes through here).
  absl::Status SubmitRead(uint32_t index);
  void FinishLoad(uint32_t index, const absl::Status& status);
  // Starts the read of `index` into `slot` ahead of any demand: a guess (a prefetch, whose use is
  // counted) or warming.
  void StartLoadAhead(uint32_t index, uint32_t slot, bool guess);
  // The hits compute made on expert `index` since the last call (from the table's count); the
  // second adds them to compute_hits.
  uint64_t TakeHits(uint32_t index);
  uint64_t TakeComputeHits(uint32_t index);
  // Expert `index` was just admitted (loaded or demoted): with exclusive tiers the hits compute made
  // while it was away from this tier (in VRAM) are touches of it, at most kMaxTouchesPerSync.
  void TouchUsesWhileAway(uint32_t index);

  TierContext& ctx_;
  IoEngine& io_;
  const int fd_;
  const ResidencyOptions& options_;
  const uint32_t n_slots_;
  const bool exclusive_;
  std::unique_ptr<ReplacementPolicy> policy_;

  std::vector<RamExpert> experts_;       // [n_layer * n_expert]
  std::vector<uint32_t> slot_owner_;     // per slot: expert index, or kFreeOwner
  std::vector<uint32_t> free_slots_;     // slots without owner (maybe still pinned: R3)
  std::deque<uint32_t> queued_;          // kQueued experts, in demand order
  std::vector<absl::Time> submit_time_;  // per expert index, of the read in flight
  int inflight_ = 0, prefetch_inflight_ = 0;
  // Warming: the next expert index to look at, when it started, and whether it has been logged.
  uint32_t warm_next_ = 0;
  bool warm_started_ = false, warm_reported_ = false;
  absl::Time warm_start_;
  uint64_t warm_bytes_start_ = 0;
  std::vector<ReadCompletion> reaped_;
  std::vector<TouchedExpert> touched_;  // SyncComputeHits' scratch, reserved for every slot
};

}  // namespace mer::residency
