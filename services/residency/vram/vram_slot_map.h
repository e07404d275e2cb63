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
// The slots that hold an expert are kept in an IndexList (common/base/index_list.h) ordered by the
// uses residency saw itself (fills and Touch), most recent at the front. A pin can only make a
// slot's use newer than that, so Candidate walks from the back and stops at the first slot whose
// own use is newer than the best candidate's: O(1 + slots passed over), not O(slots). Free slots
// are taken first, lowest index first (O(slots) while any is free).
//
// Thread-safety: one thread (the daemon's loop). No allocation after Reset.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/base/index_list.h"

namespace mer::residency {

class VramSlotMap {
 public:
  static constexpr uint32_t kFree = 0xFFFFFFFFu;

  void Reset(uint32_t n_slots);
  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t owner(uint32_t slot) const { return slots_[slot].owner; }
  bool filling(uint32_t slot) const { return slots_[slot].filling; }

  // The slot the next upload should take, changing nothing: the free slot of lowest index that is
  // not in use, else of the resident, not filling, not in use slots the least recently used
  // (lowest index among equals), provided that use is older than `used_before` (pass UINT64_MAX to
  // accept any; a prefetch passes the oldest step in flight, so a guess never displaces what a
  // running step reads next). nullopt if none.
  // in_use(slot) -> bool; pin_epoch(slot) -> uint64_t.
  template <typename InUse, typename PinEpoch>
  std::optional<uint32_t> Candidate(InUse in_use, PinEpoch pin_epoch, uint64_t used_before) const {
    if (free_ > 0) {
      for (uint32_t k = 0; k < size(); ++k)
        if (slots_[k].owner == kFree && !in_use(k)) return k;
    }
    std::optional<uint32_t> best;
    uint64_t best_use = 0;
    for (uint32_t k = by_use_.back(); k != kNilIndex; k = slots_[k].prev) {
      const Slot& s = slots_[k];
      // Every slot from here on was used at s.use_epoch or later.
      if (s.use_epoch >= used_before || (best.has_value() && s.use_epoch > best_use)) break;
      if (s.filling) continue;
      const uint64_t pe = pin_epoch(k);
      const uint64_t use = pe > s.use_epoch ? pe : s.use_epoch;
      if (use >= used_before) continue;
      if (best.has_value() && (use > best_use || (use == best_use && k > *best))) continue;
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
    uint32_t prev = kNilIndex;  // by_use_'s links, while owner != kFree
    uint32_t next = kNilIndex;
  };
  // Links slot k (not in by_use_) in by its use_epoch: after every slot used later.
  void Order(uint32_t k);

  std::vector<Slot> slots_;
  IndexList<Slot> by_use_;  // the slots with an owner; front = the latest use_epoch
  uint32_t free_ = 0, filling_ = 0;
};

}  // namespace mer::residency
