#include "common/shm/residency_table.h"

#include <thread>

#include "common/base/cpu_relax.h"

namespace mer::shm {
namespace {

constexpr uint64_t kCountMask = 0xffffffffull;
inline uint64_t Tag(uint64_t incarnation) { return (incarnation & kCountMask) << 32; }

}  // namespace

std::optional<EntryState> ResidencyTable::Read(uint32_t layer, uint32_t expert, int max_tries) const {
  if (!Contains(layer, expert)) return std::nullopt;
  const ResidencyEntry& e = entry(layer, expert);
  for (int i = 0; i < max_tries; ++i) {
    const uint64_t g1 = e.generation.load(std::memory_order_acquire);
    if ((g1 & 1) == 0) {
      EntryState s;
      s.tiers = e.tiers.load(std::memory_order_relaxed);
      s.ram_slot = e.ram_slot.load(std::memory_order_relaxed);
      s.vram_slot = e.vram_slot.load(std::memory_order_relaxed);
      s.error = e.error.load(std::memory_order_relaxed);
      s.vram_fill = e.vram_fill.load(std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      const uint64_t g2 = e.generation.load(std::memory_order_relaxed);
      if (g1 == g2) {
        s.generation = g1;
        return s;
      }
    }
    if ((i & 63) == 63) {
      std::this_thread::yield();
    } else {
      CpuRelax();
    }
  }
  return std::nullopt;
}

uint64_t ResidencyTable::Write(uint32_t layer, uint32_t expert, uint32_t tiers, uint32_t ram_slot, uint32_t vram_slot,
                               uint32_t error, uint64_t vram_fill) {
  ResidencyEntry& e = entry(layer, expert);
  // Only this thread writes these fields, so a relaxed load sees its own last write.
  const bool was_in_ram = (e.tiers.load(std::memory_order_relaxed) & kTierRam) != 0 &&
                          e.ram_slot.load(std::memory_order_relaxed) == ram_slot;
  // Only this thread writes `generation`; an odd value can only be left by a dead writer of an
  // earlier incarnation, and the segment is recreated then, so round up to even defensively.
  uint64_t g = e.generation.load(std::memory_order_relaxed);
  g += (g & 1);
  e.generation.store(g + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.tiers.store(tiers, std::memory_order_relaxed);
  e.ram_slot.store(ram_slot, std::memory_order_relaxed);
  e.vram_slot.store(vram_slot, std::memory_order_relaxed);
  e.error.store(error, std::memory_order_relaxed);
  e.vram_fill.store(vram_fill, std::memory_order_relaxed);
  e.generation.store(g + 2, std::memory_order_release);
  // (R2): order the new generation before any later load of a pin word.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if ((tiers & kTierRam) != 0 && ram_slot != kNoSlot && !was_in_ram) e.loads.fetch_add(1, std::memory_order_relaxed);
  return g + 2;
}

void ResidencyTable::NoteUse(uint32_t layer, uint32_t expert, uint64_t epoch, bool hit) {
  if (!Contains(layer, expert)) return;
  ResidencyEntry& e = entry(layer, expert);
  uint64_t prev = e.last_use_epoch.load(std::memory_order_relaxed);
  while (prev < epoch && !e.last_use_epoch.compare_exchange_weak(prev, epoch, std::memory_order_relaxed)) {
  }
  (hit ? e.hits : e.misses).fetch_add(1, std::memory_order_relaxed);
}

bool SlotPins::Pin(uint32_t slot, uint64_t incarnation, uint64_t epoch) {
  if (slot >= count_) return false;
  SlotPin& p = pins_[slot];
  const uint64_t tag = Tag(incarnation);
  uint64_t w = p.word.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t next = ((w & ~kCountMask) == tag) ? w + 1 : (tag | 1);
    if (p.word.compare_exchange_weak(w, next, std::memory_order_seq_cst, std::memory_order_relaxed)) {
      break;
    }
  }
  uint64_t last = p.last_epoch.load(std::memory_order_relaxed);
  while (last < epoch && !p.last_epoch.compare_exchange_weak(last, epoch, std::memory_order_relaxed)) {
  }
  // (C3): order the pin before the caller's re-load of the entry's generation.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return true;
}

void SlotPins::Unpin(uint32_t slot, uint64_t incarnation) {
  if (slot >= count_) return;
  SlotPin& p = pins_[slot];
  const uint64_t tag = Tag(incarnation);
  uint64_t w = p.word.load(std::memory_order_relaxed);
  for (;;) {
    if ((w & ~kCountMask) != tag || (w & kCountMask) == 0) return;  // not ours (or unbalanced)
    // Release: every read of the slot's bytes happens before residency sees the pin dropped.
    if (p.word.compare_exchange_weak(w, w - 1, std::memory_order_release, std::memory_order_relaxed)) {
      return;
    }
  }
}

bool SlotPins::InUse(uint32_t slot, uint64_t compute_incarnation, bool compute_gone) const {
  if (slot >= count_) return false;
  if (compute_gone) return false;
  // Acquire pairs with Unpin's release: when the count reads 0, compute's reads are over.
  const uint64_t w = pins_[slot].word.load(std::memory_order_seq_cst);
  return (w & kCountMask) != 0 && (w & ~kCountMask) == Tag(compute_incarnation);
}

uint32_t SlotPins::RawCount(uint32_t slot) const {
  if (slot >= count_) return 0;
  return static_cast<uint32_t>(pins_[slot].word.load(std::memory_order_acquire) & kCountMask);
}

uint64_t SlotPins::LastEpoch(uint32_t slot) const {
  if (slot >= count_) return 0;
  return pins_[slot].last_epoch.load(std::memory_order_relaxed);
}

void SlotPins::NoteConverted(uint32_t slot, uint64_t fill) {
  if (slot >= count_) return;
  // Relaxed: residency reads it only after the pin's release (Unpin) has been seen.
  pins_[slot].converted_fill.store(fill, std::memory_order_relaxed);
}

uint64_t SlotPins::ConvertedFill(uint32_t slot) const {
  if (slot >= count_) return 0;
  return pins_[slot].converted_fill.load(std::memory_order_relaxed);
}

}  // namespace mer::shm
