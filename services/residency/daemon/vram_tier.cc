#include "services/residency/daemon/vram_tier.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "services/residency/daemon/ram_tier.h"

namespace mer::residency {

VramTier::VramTier(TierContext& ctx, const ResidencyOptions& options, uint64_t max_used_bytes,
                   VramUploaderFactory factory)
    : ctx_(ctx),
      options_(options),
      max_used_bytes_(max_used_bytes),
      factory_(std::move(factory)),
      experts_(size_t{ctx.n_layer} * ctx.n_expert) {}

VramTier::~VramTier() { Close(); }

void VramTier::Close() {
  if (uploader_ != nullptr) uploader_->Close();
  closed_ = true;
}

uint64_t VramTier::ComputeEpoch() const {
  return ctx_.segment->control().compute_epoch.load(std::memory_order_relaxed);
}

void VramTier::FailWaiters(uint32_t index, absl::StatusCode code) {
  VramExpert& e = experts_[index];
  for (size_t w = 0; w < e.waiters.size(); ++w)
    ctx_.Complete(e.waiters[w], shm::kNoSlot, 0, code, e.waiter_arrival_ns[w], shm::Pool::kVram);
  e.waiters.clear();
  e.waiter_arrival_ns.clear();
  if (e.state == VramState::kQueued) e.state = VramState::kAbsent;  // queue_ skips it from now on
}

void VramTier::OnRamLoadFailed(uint32_t index, absl::StatusCode code) {
  VramExpert& e = experts_[index];
  if (e.state == VramState::kResident) {
    // Its slot is free once unpinned (R3 is checked when it is taken again).
    map_.Release(e.slot);
    e.slot = shm::kNoSlot;
    e.state = VramState::kAbsent;
  }
  FailWaiters(index, code);
}

void VramTier::Drop(const char* why) {
  if (!open_) return;
  std::fprintf(stderr, "mer-residency: VRAM arena closed: %s\n", why);
  if (uploader_ != nullptr) uploader_->Close();  // waits for the copies in flight
  open_ = false;
  prefetch_inflight_ = 0;
  for (uint32_t i = 0; i < experts_.size(); ++i) {
    VramExpert& e = experts_[i];
    if (e.state == VramState::kAbsent && e.waiters.empty()) continue;
    const bool published = e.state == VramState::kResident;
    if (e.state == VramState::kFilling) ctx_.ram->ReleaseCopy(i);
    if (e.prefetched) ++ctx_.c.vram_prefetch_wasted;
    e.state = VramState::kAbsent;
    e.slot = shm::kNoSlot;
    e.prefetched = e.prefetch_load = false;
    e.fill = 0;
    // Placements in an arena that is gone must not outlive it in the table.
    if (published) ctx_.PublishEntry(i);
    FailWaiters(i, absl::StatusCode::kUnavailable);
  }
  queue_.clear();
  map_.Reset(0);
  // Copies out of an arena that is gone did not complete (Close dropped them); device-layout
  // copies are that arena's layout.
  for (const uint32_t i : demoting_) ctx_.ram->FinishDemotion(i, false);
  demoting_.clear();
  ctx_.ram->DropDeviceCopies();
}

void VramTier::PollArena() {
  ResidencyCounters& c = ctx_.c;
  const shm::PeerInfo compute = ctx_.segment->Peer();
  // An arena dies with the compute that exported it (its memory is freed with the process).
  if (open_ && (compute.incarnation != incarnation_ || compute.gone))
    Drop("the compute that exported it is gone or restarted");
  const std::optional<shm::VramArenaRead> r =
      shm::ReadVramArena(ctx_.ep.vram_arena(), compute.incarnation, ctx_.segment->header().vram_slot_count);
  if (!r.has_value()) return;
  if (r->sequence == acted_sequence_ && compute.incarnation == acted_incarnation_) return;
  acted_sequence_ = r->sequence;
  acted_incarnation_ = compute.incarnation;
  if (absl::IsNotFound(r->info.status())) {
    Drop("compute withdrew it");
    shm::AckVramArena(ctx_.ep.vram_arena(), r->sequence, absl::StatusCode::kOk);
    return;
  }
  Drop("compute exported another arena");
  absl::Status s = r->info.status();
  if (s.ok() && r->info->slot_bytes < max_used_bytes_)
    s = absl::InvalidArgumentError(absl::StrCat("its slots of ", r->info->slot_bytes,
                                                " bytes are smaller than the store's experts (", max_used_bytes_,
                                                " bytes)"));
  if (s.ok() && uploader_ == nullptr) {
    absl::StatusOr<std::unique_ptr<VramUploader>> u = factory_();
    if (u.ok()) {
      uploader_ = std::move(*u);
    } else {
      s = u.status();
    }
  }
  if (s.ok()) s = uploader_->Import(*r->info);
  if (!s.ok()) {
    ++c.vram_arena_refusals;
    refusal_ = s.code();
    std::fprintf(stderr, "mer-residency: VRAM arena of compute %llu refused: %s\n",
                 static_cast<unsigned long long>(compute.incarnation), s.ToString().c_str());
    shm::AckVramArena(ctx_.ep.vram_arena(), r->sequence, s.code());
    return;
  }
  map_.Reset(r->info->slot_count);
  demote_bytes_ = 0;
  if (ctx_.ram->exclusive()) {
    if (r->info->slot_bytes <= ctx_.segment->header().ram_slot_bytes) {
      demote_bytes_ = r->info->slot_bytes;
    } else {
      std::fprintf(stderr,
                   "mer-residency: the arena's slots (%llu bytes) are larger than a RAM slot: experts evicted "
                   "from VRAM are not copied back (inclusive tiers)\n",
                   static_cast<unsigned long long>(r->info->slot_bytes));
    }
  }
  open_ = true;
  incarnation_ = compute.incarnation;
  ++c.vram_arena_imports;
  std::fprintf(stderr, "mer-residency: VRAM arena imported: %s\n", uploader_->Describe().c_str());
  // The table holds no placement in it yet (Drop cleared the last arena's): compute may use it
  // from the acknowledgement on.
  shm::AckVramArena(ctx_.ep.vram_arena(), r->sequence, absl::StatusCode::kOk);
}

void VramTier::HandleDemand(const shm::DemandRequest& d, int64_t now_ns) {
  ResidencyCounters& c = ctx_.c;
  ++c.vram_lookups;
  if (!open_) {
    ++c.vram_refused;
    ctx_.Complete(d, shm::kNoSlot, 0, refusal_, 0, shm::Pool::kVram);
    return;
  }
  const uint32_t i = ctx_.Index(d.layer, d.expert);
  VramExpert& e = experts_[i];
  if (e.prefetched) {  // demanded: the guess was good (resident or still filling)
    e.prefetched = false;
    ++c.vram_prefetch_useful;
  }
  if (e.state == VramState::kResident) {
    const uint64_t generation = ctx_.ResidentGeneration(i, shm::Pool::kVram, e.slot);
    ++c.vram_hits;
    map_.Touch(e.slot, ComputeEpoch());
    ctx_.Complete(d, e.slot, generation, absl::StatusCode::kOk, 0, shm::Pool::kVram);
    return;
  }
  ++c.vram_misses;
  e.waiters.push_back(d);
  e.waiter_arrival_ns.push_back(now_ns);
  if (e.state == VramState::kFilling || e.state == VramState::kQueued) {
    ++c.coalesced;
    return;
  }
  e.state = VramState::kQueued;
  queue_.push_back(i);
  // The fill reads the RAM tier: a hit there (a use its policy counts), or a read from the store
  // first.
  if (ctx_.ram->resident_slot(i) != shm::kNoSlot) {
    ++c.vram_fills_from_ram;
    ctx_.ram->NoteFillDemand(i);
  } else {
    ++c.vram_fills_from_store;
  }
}

std::optional<uint32_t> VramTier::AllocateSlot(uint64_t used_before) {
  ResidencyCounters& c = ctx_.c;
  const shm::PeerInfo compute = ctx_.segment->Peer();
  shm::SlotPins& pins = ctx_.ep.pins(shm::Pool::kVram);
  const auto in_use = [&](uint32_t k) { return pins.InUse(k, compute.incarnation, compute.gone); };
  const auto pin_epoch = [&](uint32_t k) { return pins.LastEpoch(k); };
  for (int tries = 0; tries < 4; ++tries) {
    const std::optional<uint32_t> k = map_.Candidate(in_use, pin_epoch, used_before);
    if (!k.has_value()) return std::nullopt;
    const uint32_t owner = map_.owner(*k);
    if (owner == VramSlotMap::kFree) return k;  // free and unpinned (checked by Candidate)
    VramExpert& v = experts_[owner];
    if (v.prefetched) ++(PrefetchUsed(owner) ? c.vram_prefetch_useful : c.vram_prefetch_wasted);
    // The slot is in the device layout only if compute converted this fill (it notes so while it
    // pins the slot; a prediction it never used still holds the blob) or the fill was copied from
    // a device-layout copy: only then is it demoted as one.
    const bool device_layout =
        v.converted || (v.fill != 0 && ctx_.ep.pins(shm::Pool::kVram).ConvertedFill(*k) == v.fill);
    v.prefetched = false;
    v.state = VramState::kAbsent;
    v.slot = shm::kNoSlot;
    v.fill = 0;
    v.converted = false;
    ctx_.PublishEntry(owner);  // R1, R2 (Write ends with a seq_cst fence)
    map_.Release(*k);
    ++c.vram_evictions;
    if (device_layout) Demote(owner, *k);
    if (!in_use(*k)) return k;  // R3
    // Pinned in between: free now, reusable once unpinned.
  }
  return std::nullopt;
}

void VramTier::Demote(uint32_t index, uint32_t slot) {
  // Room for the copy out and the upload that follows it into the slot.
  if (demote_bytes_ == 0 || ctx_.ram->state(index) != RamState::kAbsent ||
      uploader_->inflight() + 2 > uploader_->max_inflight())
    return;
  const std::optional<uint32_t> ram_slot = ctx_.ram->StartDemotion(index);
  if (!ram_slot.has_value()) return;
  const absl::Status s =
      uploader_->StartDownload(slot, ctx_.segment->ram_slot(*ram_slot).data(), demote_bytes_, index | kDemotionTag);
  if (!s.ok()) {
    ctx_.ram->FinishDemotion(index, false);
    return;
  }
  demoting_.push_back(index);
  ++ctx_.c.vram_demotions;
  ctx_.c.vram_demotion_bytes += demote_bytes_;
}

bool VramTier::RoomForUpload() const {
  // With demotions, room for the upload and the copy out of the slot it may take.
  return uploader_->inflight() + (demote_bytes_ > 0 ? 2 : 1) <= uploader_->max_inflight();
}

bool VramTier::PrefetchUsed(uint32_t index) const {
  const VramExpert& e = experts_[index];
  if (e.state != VramState::kResident) return false;
  return ctx_.ep.pins(shm::Pool::kVram).LastEpoch(e.slot) > e.fill_epoch;
}

bool VramTier::StartUpload(uint32_t index, bool prefetch) {
  ResidencyCounters& c = ctx_.c;
  VramExpert& e = experts_[index];
  const uint64_t used_before = prefetch ? ctx_.ep.MinInflightEpoch() : std::numeric_limits<uint64_t>::max();
  // Held from here: making room may demote another expert into a RAM slot, never this one's.
  ctx_.ram->HoldForCopy(index);
  const std::optional<uint32_t> slot = AllocateSlot(used_before);
  if (!slot.has_value()) {
    ctx_.ram->ReleaseCopy(index);
    if (!prefetch) ++c.vram_slot_waits;
    return false;
  }
  const uint32_t layer = ctx_.LayerOf(index);
  // A demoted copy is the arena's slot in its device layout; a blob is the store's payload.
  const bool converted = ctx_.ram->device_layout(index);
  const uint64_t bytes = converted ? demote_bytes_ : ctx_.store.manifest().layers[layer].used_bytes();
  const uint32_t ram_slot = ctx_.ram->resident_slot(index);
  const absl::Status s = uploader_->Start(*slot, ctx_.segment->ram_slot(ram_slot).data(), bytes, index);
  if (!s.ok()) {
    ctx_.ram->ReleaseCopy(index);
    std::fprintf(stderr, "mer-residency: upload of layer %u expert %u into VRAM: %s\n", layer, ctx_.ExpertOf(index),
                 s.ToString().c_str());
    if (!prefetch) FailWaiters(index, s.code());
    return !prefetch;  // a demand is answered (with the error); a prefetch just does not happen
  }
  map_.Fill(*slot, index, ComputeEpoch());
  e.state = VramState::kFilling;
  e.slot = *slot;
  e.converted = converted;
  e.prefetch_load = prefetch;
  e.prefetched = prefetch;
  if (prefetch) {
    ++prefetch_inflight_;
    ++c.vram_prefetch_issued;
  }
  return true;
}

bool VramTier::StartUploads() {
  if (!open_ || queue_.empty()) return false;
  bool progress = false;
  // Demand order, skipping (and keeping) experts whose RAM copy is not there yet.
  for (size_t j = 0; j < queue_.size() && RoomForUpload();) {
    const uint32_t i = queue_[j];
    if (experts_[i].state != VramState::kQueued) {  // answered meanwhile (a failed load)
      queue_.erase(queue_.begin() + j);
      continue;
    }
    const RamState ram = ctx_.ram->state(i);
    if (ram != RamState::kResident) {
      if (ram == RamState::kAbsent) {  // a RAM load first, with no RAM waiter of its own
        ctx_.ram->QueueLoad(i);
        progress = true;
      }
      ++j;
      continue;
    }
    if (!StartUpload(i, /*prefetch=*/false)) break;  // every slot pinned or filling: later
    queue_.erase(queue_.begin() + j);
    progress = true;
  }
  return progress;
}

void VramTier::PollUploads() {
  if (!open_ || uploader_->inflight() == 0) return;
  ResidencyCounters& c = ctx_.c;
  done_.clear();
  if (const absl::Status s = uploader_->Poll(&done_); !s.ok()) {
    std::fprintf(stderr, "mer-residency: %s\n", s.ToString().c_str());
    refusal_ = absl::StatusCode::kInternal;
    Drop("an upload failed");
    return;
  }
  const uint64_t epoch = ComputeEpoch();
  for (uint64_t tag : done_) {
    if ((tag & kDemotionTag) != 0) {
      const uint32_t i = static_cast<uint32_t>(tag & ~kDemotionTag);
      const auto it = std::find(demoting_.begin(), demoting_.end(), i);
      if (it == demoting_.end()) continue;
      demoting_.erase(it);
      ctx_.ram->FinishDemotion(i, true);
      continue;
    }
    const uint32_t i = static_cast<uint32_t>(tag);
    if (i >= experts_.size() || experts_[i].state != VramState::kFilling) continue;
    VramExpert& e = experts_[i];
    // The copy is complete (its event has passed): only now may compute learn of it.
    e.state = VramState::kResident;
    ctx_.ram->ReleaseCopy(i);
    map_.Filled(e.slot);
    e.fill = ++fill_counter_;
    e.fill_epoch = epoch;
    if (e.prefetch_load) --prefetch_inflight_;
    e.prefetch_load = false;
    const uint64_t g = ctx_.PublishEntry(i);
    ++c.vram_uploads;
    c.vram_upload_bytes += ctx_.store.manifest().layers[ctx_.LayerOf(i)].used_bytes();
    for (size_t w = 0; w < e.waiters.size(); ++w)
      ctx_.Complete(e.waiters[w], e.slot, g, absl::StatusCode::kOk, e.waiter_arrival_ns[w], shm::Pool::kVram);
    e.waiters.clear();
    e.waiter_arrival_ns.clear();
    ctx_.ram->DropAfterPromotion(i);  // exclusive tiers: RAM holds what VRAM does not
  }
}

void VramTier::Prefetch(uint32_t layer, uint32_t expert) {
  if (!open_ || !ctx_.ep.table().Contains(layer, expert)) return;
  if (prefetch_inflight_ >= options_.vram_prefetch_inflight_max || !RoomForUpload() || ctx_.DemandWaiting()) return;
  const uint32_t i = ctx_.Index(layer, expert);
  // Only what RAM holds already: a guess never costs a storage read here (the RAM prefetch
  // decides those), and never a pinned or recently used VRAM slot (AllocateSlot).
  if (experts_[i].state != VramState::kAbsent || ctx_.ram->state(i) != RamState::kResident) return;
  StartUpload(i, /*prefetch=*/true);
}

void VramTier::Census() {
  ResidencyCounters& c = ctx_.c;
  const uint32_t n = map_.size();
  c.vram_slots = n;
  if (n == 0) {
    c.vram_slots_free = c.vram_slots_resident = c.vram_slots_pinned = c.vram_slots_filling = 0;
    return;
  }
  const shm::PeerInfo compute = ctx_.segment->Peer();
  shm::SlotPins& pins = ctx_.ep.pins(shm::Pool::kVram);
  uint64_t free = 0, resident = 0, pinned = 0, filling = 0;
  for (uint32_t k = 0; k < n; ++k) {
    if (pins.InUse(k, compute.incarnation, compute.gone)) {
      ++pinned;
    } else if (map_.filling(k)) {
      ++filling;
    } else if (map_.owner(k) == VramSlotMap::kFree) {
      ++free;
    } else {
      ++resident;
    }
    // A prefetched expert compute pinned without asking was a good guess.
    const uint32_t owner = map_.owner(k);
    if (owner != VramSlotMap::kFree && experts_[owner].prefetched && PrefetchUsed(owner)) {
      experts_[owner].prefetched = false;
      ++c.vram_prefetch_useful;
    }
  }
  c.vram_slots_free = free;
  c.vram_slots_resident = resident;
  c.vram_slots_pinned = pinned;
  c.vram_slots_filling = filling;
}

void VramTier::CheckInvariants() const {
  int filling = 0, prefetch_filling = 0;
  for (uint32_t i = 0; i < experts_.size(); ++i) {
    const VramExpert& e = experts_[i];
    const bool has_slot = e.state == VramState::kFilling || e.state == VramState::kResident;
    CHECK_MSG(has_slot == (e.slot != shm::kNoSlot), "an expert's VRAM slot does not match its state");
    if (has_slot) {
      CHECK_MSG(open_ && e.slot < map_.size() && map_.owner(e.slot) == i,
                "an expert's VRAM slot is not its own in the slot map");
      CHECK_MSG(map_.filling(e.slot) == (e.state == VramState::kFilling),
                "the slot map's filling differs from the expert's");
    }
    CHECK_MSG(e.waiters.size() == e.waiter_arrival_ns.size(), "VRAM waiters and arrival times differ");
    if (e.state == VramState::kAbsent || e.state == VramState::kResident)
      CHECK_MSG(e.waiters.empty(), "an expert with no upload in progress has VRAM waiters");
    CHECK_MSG(!e.prefetch_load || e.state == VramState::kFilling, "a prefetch copy is not in flight");
    filling += e.state == VramState::kFilling;
    prefetch_filling += e.state == VramState::kFilling && e.prefetch_load;
  }
  for (uint32_t k = 0; k < map_.size(); ++k) {
    const uint32_t owner = map_.owner(k);
    if (owner != VramSlotMap::kFree)
      CHECK_MSG(owner < experts_.size() && experts_[owner].slot == k, "a VRAM slot's owner holds another slot");
  }
  CHECK_MSG(static_cast<uint32_t>(filling) == map_.filling_slots(), "the slot map fills other slots");
  CHECK_MSG(prefetch_filling == prefetch_inflight_, "the prefetch copies are not the filling experts");
  // The uploader's copies are the uploads and the demotions, each demotion's RAM slot waiting for it.
  if (!closed_)
    CHECK_MSG(filling + static_cast<int>(demoting_.size()) == copies_in_flight(),
              "the copies in flight are not the filling and demoting experts");
  size_t ram_demoting = 0;
  for (uint32_t i = 0; i < experts_.size(); ++i) ram_demoting += ctx_.ram->state(i) == RamState::kDemoting;
  CHECK_MSG(ram_demoting == demoting_.size(), "the RAM tier's demotions are not the copies out of the arena");
  for (const uint32_t i : demoting_)
    CHECK_MSG(ctx_.ram->state(i) == RamState::kDemoting, "a copy out of the arena has no RAM slot waiting");
  for (uint32_t i = 0; i < experts_.size(); ++i) {
    if (experts_[i].state != VramState::kQueued) continue;
    bool queued = false;
    for (const uint32_t q : queue_) queued = queued || q == i;
    CHECK_MSG(queued, "a queued upload is not in the queue");
  }
}

}  // namespace mer::residency
