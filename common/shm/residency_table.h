// The residency table (one ResidencyEntry per (layer, expert)) and the slot pins.
//
// Residency table: one writer (mer-residency), lock-free readers (mer-compute, any thread)
// -------------------------------------------------------------------------------------------
// `generation` is a sequence lock. The writer, for each change of an entry:
//   g = generation (even); generation = g + 1 (relaxed); fence(release);
//   tiers, ram_slot, vram_slot, error, vram_fill = ... (relaxed);
//   generation = g + 2 (release)
// A reader:
//   g1 = generation (acquire); if odd, retry; read the fields (relaxed); fence(acquire);
//   g2 = generation (relaxed); if g1 != g2, retry; otherwise the fields are one consistent state,
//   the state of generation g1.
// Readers never block the writer. A writer killed mid-update leaves the generation odd forever;
// readers give up after a bounded number of tries (Read returns nullopt) and treat the entry as
// not resident, and a restarted mer-residency creates a fresh segment (segment.h). last_use_epoch,
// hits and misses are not under the seqlock: compute updates them with relaxed atomic RMWs and
// residency reads them as statistics.
//
// Slot pins: compute pins what a step reads, residency never overwrites a pinned slot
// -------------------------------------------------------------------------------------------
// A slot of the RAM pool (or the VRAM arena) may be overwritten only when no step in flight may
// read it. Compute, to read expert (l, e) from RAM slot k:
//   (C1) s = Read(l, e); require kTierRam and s.ram_slot == k;
//   (C2) pin k: the pin word's count += 1 (seq_cst RMW, tagged with compute's incarnation);
//   (C3) fence(seq_cst); re-load generation; if it is not s.generation, unpin and start over.
//   ... read the slot's bytes for as long as the pin is held ... then unpin (release).
// Residency, to reuse slot k that holds (l, e):
//   (R1) Write(l, e) without kTierRam (the generation moves on);
//   (R2) fence(seq_cst);
//   (R3) reuse k only once SlotInUse(k) is false (count 0, or a tag of a dead incarnation).
// (C2)/(C3) and (R1)/(R3) are a store-then-load pair on each side separated by seq_cst fences:
// either compute's re-load in (C3) sees residency's new generation (compute backs off), or
// residency's pin load in (R3) sees compute's pin (residency waits). Never both miss.
// Pins of a compute process that died are void without anyone clearing them: the pin word carries
// the low 32 bits of the pinning compute's incarnation, and SlotInUse counts only pins of the
// current, live incarnation.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include "common/shm/layout.h"

namespace mer::shm {

// One consistent state of an entry.
struct EntryState {
  uint64_t generation = 0;  // even
  uint32_t tiers = 0;       // TierBits
  uint32_t ram_slot = kNoSlot;
  uint32_t vram_slot = kNoSlot;
  uint32_t error = 0;      // absl::StatusCode
  uint64_t vram_fill = 0;  // the upload that filled vram_slot (ResidencyEntry::vram_fill)

  bool in(Pool pool) const { return (tiers & (pool == Pool::kRam ? kTierRam : kTierVram)) != 0; }
  uint32_t slot(Pool pool) const { return pool == Pool::kRam ? ram_slot : vram_slot; }
};

class ResidencyTable {
 public:
  ResidencyTable() = default;
  ResidencyTable(ResidencyEntry* entries, uint32_t n_layer, uint32_t n_expert)
      : entries_(entries), n_layer_(n_layer), n_expert_(n_expert) {}

  uint32_t n_layer() const { return n_layer_; }
  uint32_t n_expert() const { return n_expert_; }
  bool Contains(uint32_t layer, uint32_t expert) const { return layer < n_layer_ && expert < n_expert_; }
  ResidencyEntry& entry(uint32_t layer, uint32_t expert) const {
    return entries_[uint64_t{layer} * n_expert_ + expert];
  }

  // Reader side (any thread of any process). nullopt when (layer, expert) is out of range or the
  // entry stayed mid-write for `max_tries` attempts.
  std::optional<EntryState> Read(uint32_t layer, uint32_t expert, int max_tries = 1 << 16) const;

  // Writer side (mer-residency's one writer thread). Returns the new (even) generation. `loads`
  // counts the writes that put the expert into a RAM slot it was not in.
  uint64_t Write(uint32_t layer, uint32_t expert, uint32_t tiers, uint32_t ram_slot, uint32_t vram_slot,
                 uint32_t error = 0, uint64_t vram_fill = 0);

  // Compute-side statistics (no seqlock).
  void NoteUse(uint32_t layer, uint32_t expert, uint64_t epoch, bool hit);

 private:
  ResidencyEntry* entries_ = nullptr;
  uint32_t n_layer_ = 0;
  uint32_t n_expert_ = 0;
};

class SlotPins {
 public:
  SlotPins() = default;
  SlotPins(SlotPin* pins, uint32_t count) : pins_(pins), count_(count) {}

  uint32_t count() const { return count_; }

  // Compute: adds one pin by `incarnation` (a pin word left by an older incarnation is replaced).
  // Sequentially consistent; the caller re-validates the table entry after it (C3 above).
  // False if `slot` is out of range.
  bool Pin(uint32_t slot, uint64_t incarnation, uint64_t epoch);
  // Compute: drops one pin taken by `incarnation`. A no-op if the word is not ours.
  void Unpin(uint32_t slot, uint64_t incarnation);

  // Residency: whether compute may still read `slot`. `compute_incarnation` is the current
  // compute's incarnation and `compute_gone` whether that process is known to be gone (it
  // detached, or its pid no longer exists: PeerInfo::gone). A stale heartbeat alone is not "gone":
  // a stopped process may resume and read. Pins of any other incarnation do not count.
  bool InUse(uint32_t slot, uint64_t compute_incarnation, bool compute_gone) const;
  // Pin count, whatever the tag (for tests and statistics).
  uint32_t RawCount(uint32_t slot) const;
  uint64_t LastEpoch(uint32_t slot) const;
  // Compute, holding a pin of VRAM slot `slot`: fill `fill` of it is (being) converted to the
  // device layout. Residency: the last fill so noted (0: none).
  void NoteConverted(uint32_t slot, uint64_t fill);
  uint64_t ConvertedFill(uint32_t slot) const;

 private:
  SlotPin* pins_ = nullptr;
  uint32_t count_ = 0;
};

}  // namespace mer::shm
