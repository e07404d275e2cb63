#include "services/residency/vram/vram_slot_map.h"

#include "common/base/check.h"

namespace mer::residency {

void VramSlotMap::Reset(uint32_t n_slots) {
  slots_.assign(n_slots, Slot{});
  free_ = n_slots;
  filling_ = 0;
}

void VramSlotMap::Fill(uint32_t slot, uint32_t owner, uint64_t epoch) {
  Slot& s = slots_[slot];
  CHECK(!s.filling && owner != kFree);
  if (s.owner == kFree) --free_;
  s.owner = owner;
  s.filling = true;
  s.use_epoch = epoch;
  ++filling_;
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
  if (s.owner != kFree) ++free_;
  s = Slot{};
}

void VramSlotMap::Touch(uint32_t slot, uint64_t epoch) {
  Slot& s = slots_[slot];
  if (epoch > s.use_epoch) s.use_epoch = epoch;
}

}  // namespace mer::residency
