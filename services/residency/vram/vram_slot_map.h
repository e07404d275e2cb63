// mer-residency's map of the VRAM arena compute exported: which expert each slot holds, which slots
// a copy is filling, and which slot the next upload takes.
//
// Victims are chosen least recently used, where a slot's last use is the newer of its fill and the
// newest step epoch that pinned it (SlotPin::last_epoch, written by compute: compute pins what it
// reads without telling residency, so the pins are where its uses show). The map never decides
// alone that a slot may be overwritten: Candidate skips every slot `in_use` reports (the pin check,
// R3 of common/shm/residency_table.h), and the caller re-checks after unpublishing the victim
// (R1-R2) before it writes the slot. A slot being filled is never a candidate.
//
// Thread-safety: one thread (the daemon's loop). O(slots) per Candidate, no allocation.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace mer::residency {

class VramSlotMap {
 public:
  static constexpr uint32_t kFree = 0xFFFFFFFFu;

  void Reset(uint32_t n_slots);
  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t owner(uint32_t slot) const { return slots_[slot].owner; }
  bool filling(uint32_t slot) const { return slots_[slot].filling; }

  // The slot the next upload should take, changing nothing: a free slot that is not in use, else
  // the resident, not filling, not in use slot least recently used, provided that use is older
  // than `used_before` (pass UINT64_MAX to accept any; a prefetch passes the oldest step in
  // flight, so a guess never displaces what a running step reads next). nullopt if none.
  // in_use(slot) -> bool; pin_epoch(slot) -> uint64_t.
  template <typename InUse, typename PinEpoch>
  std::optional<uint32_t> Candidate(InUse in_use, PinEpoch pin_epoch, uint64_t used_before) const {
    std::optional<uint32_t> best;
    uint64_t best_use = 0;
    for (uint32_t k = 0; k < size(); ++k) {
      const Slot& s = slots_[k];
      if (s.filling) continue;
      if (s.owner == kFree) {
        if (!in_use(k)) return k;
        continue;
      }
      const uint64_t pe = pin_epoch(k);
      const uint64_t use = pe > s.use_epoch ? pe : s.use_epoch;
      if (use >= used_before || (best.has_value() && use >= best_use)) continue;
      if (in_use(k)) continue;
      best = k;
      best_use = use;
    }
    return best;
  }

  // `owner` is being copied into `slot` (from epoch `epoch` on); Filled when the copy is complete.
  void Fill(uint32_t slot, uint32_t owner, uint64_t epoch);
  void Filled(uint32_t slot);
  // The slot holds nothing (its owner was unpublished, or its fill failed).
  void Release(uint32_t slot);
  // A use residency saw itself (a demand that hit).
  void Touch(uint32_t slot, uint64_t epoch);

  uint32_t free_slots() const { return free_; }
  uint32_t filling_slots() const { return filling_; }

 private:
  struct Slot {
    uint32_t owner = kFree;
    bool filling = false;
    uint64_t use_epoch = 0;
  };
  std::vector<Slot> slots_;
  uint32_t free_ = 0, filling_ = 0;
};

}  // namespace mer::residency
