// mer-residency's VRAM tier: the arena mer-compute exports over CUDA IPC (docs/cuda.md, "The arena
// over CUDA IPC"), imported when compute exports it and closed when compute withdraws it or goes;
// which expert each of its slots holds (VramSlotMap), and the RAM -> VRAM copies that fill them
// (VramUploader). The loop (residency_daemon.h) drives it:
//   PollArena     an arena exported or withdrawn since the last turn is imported or closed;
//   HandleDemand  a VRAM DemandRequest: completes at once if the expert is in VRAM, else waits for
//                 an upload (after a load into RAM if need be), or is refused without an arena;
//   StartUploads  uploads of demanded experts that RAM holds, in demand order, each into a free
//                 or least recently used unpinned slot (the resident there unpublished first,
//                 R1-R3 of common/shm/residency_table.h);
//   PollUploads   finished copies: an upload is published only once its copy has completed;
//   Prefetch      a predicted expert that RAM holds moved into VRAM, only while no demand waits,
//                 never into a slot a step in flight may still read.
//
// An expert's VRAM state: kAbsent -> kQueued (demanded, waiting for its RAM copy or a slot) ->
// kFilling (its copy in flight; the RAM tier keeps the source slot, HoldForCopy) -> kResident
// (published) -> kAbsent (evicted, the arena closed, or its RAM load failed); a prefetch goes from
// kAbsent to kFilling directly. With exclusive tiers (ram_tier.h) an evicted expert is copied
// back into the RAM tier (Demote), and a completed fill lets go of its RAM copy.
//
// Thread-safety: the loop's thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/shm/layout.h"
#include "services/residency/daemon/residency_options.h"
#include "services/residency/daemon/tier_context.h"
#include "services/residency/vram/vram_slot_map.h"
#include "services/residency/vram/vram_uploader.h"

namespace mer::residency {

enum class VramState : uint8_t {
  kAbsent,    // no slot
  kQueued,    // demanded: in the upload queue, waiting for its RAM copy or a slot (no slot yet)
  kFilling,   // its copy into its slot is in flight
  kResident,  // published in its slot
};

class VramTier {
 public:
  // `max_used_bytes`: the largest expert payload of the store (what one upload copies); an arena
  // of smaller slots is refused. `factory` makes the uploader at the first import.
  VramTier(TierContext& ctx, const ResidencyOptions& options, uint64_t max_used_bytes, VramUploaderFactory factory);
  // Closes the uploader: copies from the RAM slots end first.
  ~VramTier();

  void set_uploader_factory(VramUploaderFactory factory) { factory_ = std::move(factory); }
  bool open() const { return open_; }

  void PollArena();
  void HandleDemand(const shm::DemandRequest& d, int64_t now_ns);
  // Whether an upload started or a RAM load was queued for one.
  bool StartUploads();
  void PollUploads();
  void Prefetch(uint32_t layer, uint32_t expert);
  // The VRAM slot gauges of the counters; a prefetched expert compute has pinned since its fill
  // is counted useful here.
  void Census();
  // Waits for the copies in flight and closes the uploader (they read our RAM slots).
  void Close();
  // CHECKs the tier's bookkeeping against the slot map (ResidencyOptions::check_invariants).
  void CheckInvariants() const;

  // The expert's RAM load failed for good: its VRAM copy is dropped (the failed entry shows no
  // tier) and its VRAM waiters get `code`.
  void OnRamLoadFailed(uint32_t index, absl::StatusCode code);
  VramState state(uint32_t index) const { return experts_[index].state; }
  // Its slot while resident, else shm::kNoSlot; and its fill number (ResidencyEntry::vram_fill).
  uint32_t resident_slot(uint32_t index) const {
    const VramExpert& e = experts_[index];
    return e.state == VramState::kResident ? e.slot : shm::kNoSlot;
  }
  uint64_t fill(uint32_t index) const { return experts_[index].fill; }
  // Whether its published fill was copied from a device-layout RAM copy (kTierVramConverted).
  bool converted(uint32_t index) const {
    return experts_[index].state == VramState::kResident && experts_[index].converted;
  }
  bool has_waiters(uint32_t index) const { return !experts_[index].waiters.empty(); }
  bool uploads_queued() const { return !queue_.empty(); }
  int copies_in_flight() const { return uploader_ != nullptr ? uploader_->inflight() : 0; }

 private:
  struct VramExpert {
    VramState state = VramState::kAbsent;
    uint32_t slot = shm::kNoSlot;  // kFilling, kResident
    bool prefetched = false;       // filled by a prediction, not used since
    bool prefetch_load = false;    // the copy in flight is a prefetch
    bool converted = false;        // the fill's source was a device-layout RAM copy
    uint64_t fill = 0;             // the published fill number (ResidencyEntry::vram_fill)
    uint64_t fill_epoch = 0;       // compute_epoch when the fill was published
    std::vector<shm::DemandRequest> waiters;
    std::vector<int64_t> waiter_arrival_ns;
  };

  // Tags of copies out of the arena (demotions) carry this bit; uploads' tags are expert indices.
  static constexpr uint64_t kDemotionTag = uint64_t{1} << 63;

  void Drop(const char* why);
  std::optional<uint32_t> AllocateSlot(uint64_t used_before);
  // Exclusive tiers: copies evicted expert `index`, just unpublished from arena slot `slot`, back
  // into a RAM slot, when the RAM tier has none of it and a copy event is free (else it is simply
  // dropped); an upload into the slot started after this is ordered after the copy.
  void Demote(uint32_t index, uint32_t slot);
  // Whether the uploader has a copy event free for an upload (two with demotions).
  bool RoomForUpload() const;
  // Starts the copy of expert `index` (RAM-resident) into a VRAM slot; false if no slot is free.
  bool StartUpload(uint32_t index, bool prefetch);
  void FailWaiters(uint32_t index, absl::StatusCode code);
  // Whether compute has pinned the prefetched expert's slot since its fill (a use it made without
  // asking).
  bool PrefetchUsed(uint32_t index) const;
  uint64_t ComputeEpoch() const;

  TierContext& ctx_;
  const ResidencyOptions& options_;
  const uint64_t max_used_bytes_;
  VramUploaderFactory factory_;
  std::unique_ptr<VramUploader> uploader_;
  bool open_ = false;
  bool closed_ = false;          // Close() dropped the copies in flight
  uint64_t incarnation_ = 0;     // the compute incarnation whose arena is open
  uint64_t acted_sequence_ = 0;  // the last export acted on
  uint64_t acted_incarnation_ = 0;
  absl::StatusCode refusal_ = absl::StatusCode::kFailedPrecondition;  // for demands without arena
  VramSlotMap map_;
  uint64_t fill_counter_ = 0;
  std::vector<VramExpert> experts_;  // [n_layer * n_expert]
  // Demanded experts waiting for an upload, in demand order; an entry whose expert is no longer
  // kQueued (its waiters were failed) is dropped when reached.
  std::deque<uint32_t> queue_;
  int prefetch_inflight_ = 0;
  // Exclusive tiers: bytes copied back per demotion (the arena's slot; 0: no demotions, as with
  // inclusive tiers or slots larger than a RAM slot), and the experts whose copy is in flight.
  uint64_t demote_bytes_ = 0;
  std::vector<uint32_t> demoting_;
  std::vector<uint64_t> done_;
};

}  // namespace mer::residency
