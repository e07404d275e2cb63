#include "services/residency/vram/vram_slot_map.h"

#include "common/base/check.h"

namespace mer::residency {

void VramSlotMap::Reset(uint32_t n_slots) {
  slots_.assign(n_slots, Slot{});
  by_use_.Clear();
  free_ = n_slots;
  filling_ = 0;
}

void VramSlotMap::Order(uint32_t k) {
  // Uses arrive mostly in epoch order: the walk from the front ends at once.
  uint32_t pos = by_use_.front();
  while (pos != kNilIndex && slots_[pos].use_epoch > slots_[k].use_epoch) pos = slots_[pos].next;
  if (pos == kNilIndex)
    by_use_.PushBack(slots_, k);
  else
    by_use_.InsertBefore(slots_, pos, k);
}

void VramSlotMap::Fill(uint32_t slot, uint32_t owner, uint64_t epoch) {
  Slot& s = slots_[slot];
  CHECK(!s.filling && owner != kFree);
  if (s.owner == kFree)
    --free_;
  else
    by_use_.Unlink(slots_, slot);
  s.owner = owner;
  s.filling = true;
  s.use_epoch = epoch;
  ++filling_;
  Order(slot);
}

void VramSlotMap::Filled(uint32_t slot) {
  Slot& s = slots_[slot];
  CHECK(s.filling);
  s.filling = false;
  --filling_;
}

void VramSlotMap::Release(uint32_t slot) {
  Slot& s = slots_[slot];
  if (s.filling) --filling_;
  if (s.owner != kFree) {
    ++free_;
    by_use_.Unlink(slots_, slot);
  }
  s = Slot{};
}

void VramSlotMap::Touch(uint32_t slot, uint64_t epoch) {
  Slot& s = slots_[slot];
  if (epoch <= s.use_epoch) return;
  s.use_epoch = epoch;
  if (s.owner == kFree) return;
  by_use_.Unlink(slots_, slot);
  Order(slot);
}

}  // namespace mer::residency
