#include "services/residency/daemon/ram_tier.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "services/residency/daemon/vram_tier.h"

namespace mer::residency {
namespace {

constexpr uint64_t kMaxRegisteredBuffer = uint64_t{1} << 30;

}  // namespace

RamTier::RamTier(TierContext& ctx, IoEngine& io, int experts_fd, const ResidencyOptions& options,
                 std::unique_ptr<ReplacementPolicy> policy)
    : ctx_(ctx),
      io_(io),
      fd_(experts_fd),
      options_(options),
      n_slots_(ctx.segment->header().ram_slot_count),
      exclusive_(options.tiers == "exclusive" ||
                 (options.tiers == "auto" &&
                  uint64_t{n_slots_} < uint64_t{ctx.n_layer} * ShareExpertsPerLayer(options, ctx.n_expert))),
      policy_(std::move(policy)),
      experts_(size_t{ctx.n_layer} * ctx.n_expert),
      slot_owner_(n_slots_, kFreeOwner),
      submit_time_(size_t{ctx.n_layer} * ctx.n_expert) {
  free_slots_.reserve(n_slots_);
  touched_.reserve(n_slots_);
  for (uint32_t k = n_slots_; k-- > 0;) free_slots_.push_back(k);
}

bool RamTier::RegisterBuffers() {
  const shm::SegmentHeader& h = ctx_.segment->header();
  std::vector<IoBuffer> buffers;
  const uint64_t per = std::max<uint64_t>(1, kMaxRegisteredBuffer / h.ram_slot_bytes);
  for (uint32_t k = 0; k < h.ram_slot_count; k += per) {
    const uint64_t n = std::min<uint64_t>(per, h.ram_slot_count - k);
    buffers.push_back({ctx_.segment->ram_slot(k).data(), static_cast<size_t>(n * h.ram_slot_bytes)});
  }
  return buffers.size() <= 16384 && io_.RegisterBuffers(buffers).ok();
}

void RamTier::HandleDemand(const shm::DemandRequest& d, int64_t now_ns) {
  ResidencyCounters& c = ctx_.c;
  const uint32_t i = ctx_.Index(d.layer, d.expert);
  RamExpert& e = experts_[i];
  // A device-layout copy is no blob: a RAM demand reads the blob again.
  if (e.state == RamState::kResident && e.device_layout && !e.copying) Evict(i);
  if (e.state == RamState::kResident && !e.device_layout) {
    const uint64_t generation = ctx_.ResidentGeneration(i, shm::Pool::kRam, e.slot);
    ++c.hits;
    const ExpertKey key = PackExpertKey(d.layer, d.expert);
    if (policy_->Contains(key)) policy_->Touch(key);
    if (e.prefetched) {
      e.prefetched = false;
      ++c.prefetch_useful;
    }
    ctx_.Complete(d, e.slot, generation, absl::StatusCode::kOk);
    return;
  }
  ++c.misses;
  if (e.prefetched) {  // demanded while its prefetch is in flight: it was a good guess
    e.prefetched = false;
    ++c.prefetch_useful;
  }
  e.waiters.push_back(d);
  e.waiter_arrival_ns.push_back(now_ns);
  // Loading, queued, or a device copy on its way or being read into VRAM: FinishLoad,
  // FinishDemotion or the copy's end answers it (the latter two by queueing a read).
  if (e.state != RamState::kAbsent) {
    ++c.coalesced;
    return;
  }
  QueueLoad(i);
}

void RamTier::QueueLoad(uint32_t index) {
  RamExpert& e = experts_[index];
  CHECK(e.state == RamState::kAbsent);
  e.attempts = 0;
  e.state = RamState::kQueued;
  queued_.push_back(index);
}

void RamTier::HoldForCopy(uint32_t index) {
  RamExpert& e = experts_[index];
  CHECK(e.state == RamState::kResident && !e.copying);
  e.copying = true;
}

void RamTier::ReleaseCopy(uint32_t index) {
  RamExpert& e = experts_[index];
  CHECK(e.copying);
  e.copying = false;
}

std::optional<uint32_t> RamTier::AllocateSlot(ExpertKey incoming, bool for_prefetch) {
  ResidencyCounters& c = ctx_.c;
  // A free slot no step can still read (R3).
  for (size_t j = free_slots_.size(); j-- > 0;) {
    const uint32_t k = free_slots_[j];
    if (ctx_.ep.SlotReusable(shm::Pool::kRam, k)) {
      free_slots_.erase(free_slots_.begin() + j);
      return k;
    }
  }
  // Evict the policy's victim among residents whose slot is not pinned.
  const shm::PeerInfo compute = ctx_.segment->Peer();
  shm::SlotPins& pins = ctx_.ep.pins(shm::Pool::kRam);
  for (int tries = 0; tries < 4; ++tries) {
    const std::optional<ExpertKey> victim = policy_->ChooseVictim(
        [&](ExpertKey key) {
          const uint32_t vi = ctx_.Index(KeyLayer(key), KeyExpert(key));
          const RamExpert& v = experts_[vi];
          // A copy into VRAM reads the RAM slot until it completes, and a demanded upload waiting
          // for a copy event or a VRAM slot reads it next: evicted, the expert would be read again.
          return v.state == RamState::kResident && !v.copying && ctx_.vram->state(vi) != VramState::kQueued &&
                 !pins.InUse(v.slot, compute.incarnation, compute.gone);
        },
        for_prefetch ? kNoKey : incoming);
    if (!victim.has_value()) return std::nullopt;
    const uint32_t vi = ctx_.Index(KeyLayer(*victim), KeyExpert(*victim));
    const uint32_t k = experts_[vi].slot;
    ++c.evictions;
    if (Evict(vi)) {
      free_slots_.pop_back();  // Evict listed it; it is this caller's now
      return k;
    }
  }
  return std::nullopt;
}

bool RamTier::Evict(uint32_t index) {
  ResidencyCounters& c = ctx_.c;
  RamExpert& v = experts_[index];
  CHECK(v.state == RamState::kResident && !v.copying);
  const uint32_t k = v.slot;
  ctx_.ep.EvictRam(ctx_.LayerOf(index), ctx_.ExpertOf(index));  // R1 (and R2)
  policy_->Remove(PackExpertKey(ctx_.LayerOf(index), ctx_.ExpertOf(index)));
  // The hits compute made since the last sync still count, and tell whether a prefetch was used.
  const bool hit_since_sync = TakeComputeHits(index) > 0;
  if (v.prefetched) ++(hit_since_sync ? c.prefetch_useful : c.prefetch_wasted);
  v.prefetched = false;
  v.device_layout = false;
  FreeSlot(index);
  return ctx_.ep.SlotReusable(shm::Pool::kRam, k);  // R3
}

void RamTier::FreeSlot(uint32_t index) {
  RamExpert& e = experts_[index];
  slot_owner_[e.slot] = kFreeOwner;
  free_slots_.push_back(e.slot);
  e.slot = shm::kNoSlot;
  e.state = RamState::kAbsent;
}

std::optional<uint32_t> RamTier::StartDemotion(uint32_t index) {
  RamExpert& e = experts_[index];
  CHECK(exclusive_ && e.state == RamState::kAbsent);
  const std::optional<uint32_t> slot =
      AllocateSlot(PackExpertKey(ctx_.LayerOf(index), ctx_.ExpertOf(index)), /*for_prefetch=*/false);
  if (!slot.has_value()) return std::nullopt;
  e.slot = *slot;
  e.state = RamState::kDemoting;
  slot_owner_[*slot] = index;
  return slot;
}

void RamTier::FinishDemotion(uint32_t index, bool ok) {
  RamExpert& e = experts_[index];
  CHECK(e.state == RamState::kDemoting);
  if (!ok) {
    FreeSlot(index);
  } else {
    e.state = RamState::kResident;
    e.device_layout = true;
    policy_->Admit(PackExpertKey(ctx_.LayerOf(index), ctx_.ExpertOf(index)));
    TouchUsesWhileAway(index);
    ctx_.PublishEntry(index);
    if (e.waiters.empty()) return;
    Evict(index);  // RAM demands came meanwhile: they need the blob
  }
  if (!e.waiters.empty()) QueueLoad(index);
}

void RamTier::DropAfterPromotion(uint32_t index) {
  RamExpert& e = experts_[index];
  if (!exclusive_ || e.state != RamState::kResident || e.copying) return;
  Evict(index);
  if (!e.waiters.empty()) QueueLoad(index);  // a RAM demand for the device copy waited for this copy
}

void RamTier::DropDeviceCopies() {
  for (uint32_t i = 0; i < experts_.size(); ++i)
    if (experts_[i].state == RamState::kResident && experts_[i].device_layout && !experts_[i].copying) Evict(i);
}

absl::Status RamTier::SubmitRead(uint32_t index) {
  const RamExpert& e = experts_[index];
  ReadRequest r;
  r.fd = fd_;
  r.offset = ctx_.store.BlobOffset(static_cast<int>(ctx_.LayerOf(index)), static_cast<int>(ctx_.ExpertOf(index)));
  r.length = ctx_.store.blob_bytes();
  r.dest = ctx_.segment->ram_slot(e.slot).data();
  r.tag = index;
  RETURN_IF_ERROR(io_.Submit(absl::MakeConstSpan(&r, 1)));
  submit_time_[index] = ctx_.clock.Now();
  return absl::OkStatus();
}

absl::Status RamTier::Submit(uint32_t index) {
  RETURN_IF_ERROR(SubmitRead(index));
  RamExpert& e = experts_[index];
  e.state = RamState::kLoading;
  ++inflight_;
  if (e.prefetch_load) ++prefetch_inflight_;
  return absl::OkStatus();
}

uint64_t RamTier::TakeHits(uint32_t index) {
  RamExpert& e = experts_[index];
  const uint64_t hits =
      ctx_.ep.table().entry(ctx_.LayerOf(index), ctx_.ExpertOf(index)).hits.load(std::memory_order_relaxed);
  if (hits <= e.hits_seen) return 0;
  const uint64_t fresh = hits - e.hits_seen;
  e.hits_seen = hits;
  return fresh;
}

uint64_t RamTier::TakeComputeHits(uint32_t index) {
  const uint64_t fresh = TakeHits(index);
  ctx_.c.compute_hits += fresh;
  return fresh;
}

void RamTier::TouchUsesWhileAway(uint32_t index) {
  // Not RAM hits (compute_hits): the expert was not here.
  const uint64_t away = TakeHits(index);
  // With inclusive tiers an expert leaves RAM because the policy let it go, and what compute did
  // with it meanwhile does not change that choice. With exclusive tiers it left because VRAM took
  // it, and compute's pins of it there are uses this tier would have counted had it kept a copy:
  // without them an expert that VRAM serves looks colder here than one that keeps missing VRAM.
  if (!exclusive_ || away == 0) return;
  const ExpertKey key = PackExpertKey(ctx_.LayerOf(index), ctx_.ExpertOf(index));
  for (uint64_t n = std::min(away, kMaxTouchesPerSync); n > 0; --n) policy_->Touch(key);
}

void RamTier::NoteFillDemand(uint32_t index) {
  if (experts_[index].state != RamState::kResident) return;
  const ExpertKey key = PackExpertKey(ctx_.LayerOf(index), ctx_.ExpertOf(index));
  if (policy_->Contains(key)) policy_->Touch(key);
}

void RamTier::SyncComputeHits() {
  touched_.clear();
  for (uint32_t k = 0; k < n_slots_; ++k) {
    const uint32_t i = slot_owner_[k];
    if (i == kFreeOwner) continue;
    RamExpert& e = experts_[i];
    if (e.state == RamState::kLoading || e.state == RamState::kDemoting) continue;
    const uint64_t new_hits = TakeComputeHits(i);
    if (new_hits == 0) continue;
    const shm::ResidencyEntry& entry = ctx_.ep.table().entry(ctx_.LayerOf(i), ctx_.ExpertOf(i));
    touched_.push_back(
        {entry.last_use_epoch.load(std::memory_order_relaxed), i, std::min<uint64_t>(new_hits, kMaxTouchesPerSync)});
    if (e.prefetched) {
      e.prefetched = false;
      ++ctx_.c.prefetch_useful;
    }
  }
  std::sort(touched_.begin(), touched_.end(),
            [](const TouchedExpert& a, const TouchedExpert& b) { return a.epoch < b.epoch; });
  for (const TouchedExpert& t : touched_) {
    const ExpertKey key = PackExpertKey(ctx_.LayerOf(t.index), ctx_.ExpertOf(t.index));
    if (!policy_->Contains(key)) continue;
    for (uint64_t n = 0; n < t.touches; ++n) policy_->Touch(key);
  }
}

bool RamTier::StartLoads() {
  bool progress = false;
  if (!queued_.empty()) SyncComputeHits();
  while (!queued_.empty() && inflight_ < options_.io_inflight_max) {
    const uint32_t i = queued_.front();
    RamExpert& e = experts_[i];
    const std::optional<uint32_t> slot =
        AllocateSlot(PackExpertKey(ctx_.LayerOf(i), ctx_.ExpertOf(i)), /*for_prefetch=*/false);
    if (!slot.has_value()) {
      ++ctx_.c.slot_waits;  // every slot pinned: wait for a Release
      break;
    }
    queued_.pop_front();
    e.slot = *slot;
    e.prefetch_load = false;
    slot_owner_[*slot] = i;
    const absl::Status s = Submit(i);
    if (!s.ok()) FinishLoad(i, s);
    progress = true;
  }
  return progress;
}

void RamTier::Prefetch(uint32_t layer, uint32_t expert) {
  if (!ctx_.ep.table().Contains(layer, expert)) return;
  if (prefetch_inflight_ >= options_.prefetch_inflight_max || inflight_ >= options_.io_inflight_max) return;
  const uint32_t i = ctx_.Index(layer, expert);
  RamExpert& e = experts_[i];
  if (e.state != RamState::kAbsent) return;
  const std::optional<uint32_t> slot = AllocateSlot(PackExpertKey(layer, expert), true);
  if (!slot.has_value()) return;  // never a pinned slot for a guess
  StartLoadAhead(i, *slot, /*guess=*/true);
}

void RamTier::StartLoadAhead(uint32_t index, uint32_t slot, bool guess) {
  RamExpert& e = experts_[index];
  e.slot = slot;
  e.prefetch_load = guess;  // a guess counts against prefetch_inflight_max
  e.prefetched = guess;
  e.attempts = 0;
  slot_owner_[slot] = index;
  ++(guess ? ctx_.c.prefetch_issued : ctx_.c.warm_loads);
  const absl::Status s = Submit(index);
  if (!s.ok()) FinishLoad(index, s);
}

bool RamTier::Warm() {
  const uint32_t total = static_cast<uint32_t>(experts_.size());
  if (warm_reported_) return false;
  if (warm_next_ == 0 && !warm_started_) {
    warm_started_ = true;
    warm_start_ = ctx_.clock.Now();
    warm_bytes_start_ = ctx_.c.bytes_read;
  }
  const int cap = std::max(1, options_.io_inflight_max - 2);  // room for demand reads
  bool started = false;
  while (warm_next_ < total && inflight_ < cap && !free_slots_.empty()) {
    const uint32_t i = warm_next_++;
    const uint32_t layer = ctx_.LayerOf(i), expert = ctx_.ExpertOf(i);
    if (!ctx_.ep.table().Contains(layer, expert) || experts_[i].state != RamState::kAbsent) continue;
    if (!InExpertShare(options_, expert)) continue;  // another rank's
    const std::optional<uint32_t> slot = AllocateSlot(PackExpertKey(layer, expert), true);
    if (!slot.has_value()) break;
    StartLoadAhead(i, *slot, /*guess=*/false);
    started = true;
  }
  if (free_slots_.empty()) warm_next_ = total;  // the tier is full
  // Reported once the last warming read has completed (later turns come back here for that).
  if (warm_next_ >= total && io_.outstanding() == 0) {
    warm_reported_ = true;
    const double secs = absl::ToDoubleSeconds(ctx_.clock.Now() - warm_start_);
    const double gb = double(ctx_.c.bytes_read - warm_bytes_start_) / 1e9;
    std::fprintf(stderr, "mer-residency: RAM tier warmed: %llu experts read, %.2f GB in %.1f s (%.2f GB/s)\n",
                 static_cast<unsigned long long>(ctx_.c.warm_loads), gb, secs, secs > 0 ? gb / secs : 0.0);
  }
  return started;
}

void RamTier::FinishLoad(uint32_t index, const absl::Status& status) {
  ResidencyCounters& c = ctx_.c;
  RamExpert& e = experts_[index];
  const uint32_t layer = ctx_.LayerOf(index), expert = ctx_.ExpertOf(index);
  if (e.state == RamState::kLoading) {  // else its read could not be submitted
    --inflight_;
    if (e.prefetch_load) --prefetch_inflight_;
  }
  if (status.ok()) {
    e.state = RamState::kResident;
    const uint64_t g = ctx_.PublishEntry(index);
    const ExpertKey key = PackExpertKey(layer, expert);
    if (e.prefetched && e.waiters.empty()) {
      policy_->AdmitPrefetched(key);
    } else {
      e.prefetched = false;
      policy_->Admit(key);
    }
    TouchUsesWhileAway(index);
    ++c.loads;
    for (size_t w = 0; w < e.waiters.size(); ++w)
      ctx_.Complete(e.waiters[w], e.slot, g, absl::StatusCode::kOk, e.waiter_arrival_ns[w]);
  } else {
    // Never publish what failed: the slot goes back, the waiters get the error.
    FreeSlot(index);
    if (e.prefetched && e.waiters.empty() && !ctx_.vram->has_waiters(index)) {
      ++c.prefetch_wasted;
    } else {
      ++c.load_failures;
      const uint64_t g = ctx_.ep.PublishFailed(layer, expert, status.code());
      std::fprintf(stderr, "mer-residency: layer %u expert %u: %s\n", layer, expert,
                   std::string(status.message()).c_str());
      for (size_t w = 0; w < e.waiters.size(); ++w)
        ctx_.Complete(e.waiters[w], shm::kNoSlot, g, status.code(), e.waiter_arrival_ns[w]);
      // The failed entry shows no tier: the VRAM copy goes too, and its waiters get the error.
      ctx_.vram->OnRamLoadFailed(index, status.code());
    }
    e.prefetched = false;
  }
  e.waiters.clear();
  e.waiter_arrival_ns.clear();
  e.prefetch_load = false;
}

absl::Status RamTier::Reap() {
  if (io_.outstanding() == 0) return absl::OkStatus();
  ResidencyCounters& c = ctx_.c;
  reaped_.clear();
  ASSIGN_OR_RETURN(const int n, io_.Wait(0, absl::ZeroDuration(), &reaped_));
  const absl::Time now = ctx_.clock.Now();
  for (int j = 0; j < n; ++j) {
    const ReadCompletion& rc = reaped_[j];
    const uint32_t i = static_cast<uint32_t>(rc.tag);
    if (i >= experts_.size() || experts_[i].state != RamState::kLoading) continue;
    RamExpert& e = experts_[i];
    const int layer = static_cast<int>(ctx_.LayerOf(i)), expert = static_cast<int>(ctx_.ExpertOf(i));
    ++c.reads;
    c.bytes_read += rc.bytes;
    const absl::Duration latency = now - submit_time_[i];
    const uint64_t us = static_cast<uint64_t>(absl::ToInt64Microseconds(latency));
    const double seconds = absl::ToDoubleSeconds(latency);
    c.read_latency_seconds_total += seconds;
    size_t bucket = 0;
    while (bucket < kReadLatencyBucketsSeconds.size() && seconds > kReadLatencyBucketsSeconds[bucket]) ++bucket;
    ++c.read_latency_buckets[bucket];
    c.read_latency_us_total += us;
    c.read_latency_us_max = std::max(c.read_latency_us_max, us);
    absl::Status s = rc.status;
    if (!s.ok()) {
      ++c.read_errors;
      s = absl::Status(s.code(), absl::StrCat("reading layer ", layer, " expert ", expert, ": ", s.message()));
    } else {
      s = ctx_.store.VerifyBlob(layer, expert, ctx_.segment->ram_slot(e.slot).data());
      if (!s.ok()) ++c.checksum_failures;
    }
    if (!s.ok() && e.attempts < options_.max_refetches) {
      ++e.attempts;
      ++c.refetches;
      const absl::Status again = SubmitRead(i);  // still kLoading, still one read in flight
      if (again.ok()) continue;
      s = again;
    }
    FinishLoad(i, s);
  }
  return absl::OkStatus();
}

void RamTier::Census() {
  const shm::PeerInfo compute = ctx_.segment->Peer();
  shm::SlotPins& pins = ctx_.ep.pins(shm::Pool::kRam);
  uint64_t free = 0, resident = 0, pinned = 0, loading = 0;
  for (uint32_t k = 0; k < n_slots_; ++k) {
    const uint32_t owner = slot_owner_[k];
    if (pins.InUse(k, compute.incarnation, compute.gone)) {
      ++pinned;
    } else if (owner == kFreeOwner) {
      ++free;
    } else if (experts_[owner].state == RamState::kLoading || experts_[owner].state == RamState::kDemoting) {
      ++loading;
    } else {
      ++resident;
    }
  }
  ResidencyCounters& c = ctx_.c;
  c.slots_free = free;
  c.slots_resident = resident;
  c.slots_pinned = pinned;
  c.slots_loading = loading;
}

void RamTier::Drain(absl::Duration limit) {
  const absl::Time deadline = absl::Now() + limit;
  while (io_.outstanding() > 0 && absl::Now() < deadline) {
    reaped_.clear();
    if (!io_.Wait(1, absl::Milliseconds(10), &reaped_).ok()) break;
  }
}

void RamTier::CheckInvariants() const {
  // Every slot is owned by the expert that names it, or free and in the free list once.
  std::vector<uint8_t> listed(n_slots_, 0);
  for (const uint32_t k : free_slots_) {
    CHECK_MSG(k < n_slots_ && slot_owner_[k] == kFreeOwner, "a slot in the free list has an owner");
    CHECK_MSG(listed[k] == 0, "a slot is in the free list twice");
    listed[k] = 1;
  }
  for (uint32_t k = 0; k < n_slots_; ++k) {
    const uint32_t i = slot_owner_[k];
    if (i == kFreeOwner) {
      CHECK_MSG(listed[k] == 1, "a free slot is missing from the free list");
      continue;
    }
    CHECK_MSG(i < experts_.size() && experts_[i].slot == k, "a slot's owner holds another slot");
  }
  // Each expert's state against its slot, the queue, the reads in flight and the policy.
  int loading = 0, prefetch_loading = 0;
  int64_t queued = 0, resident = 0;
  for (uint32_t i = 0; i < experts_.size(); ++i) {
    const RamExpert& e = experts_[i];
    const bool has_slot =
        e.state == RamState::kLoading || e.state == RamState::kResident || e.state == RamState::kDemoting;
    CHECK_MSG(has_slot == (e.slot != shm::kNoSlot), "an expert's slot does not match its state");
    if (has_slot) CHECK_MSG(e.slot < n_slots_ && slot_owner_[e.slot] == i, "an expert's slot is not its own");
    CHECK_MSG(e.waiters.size() == e.waiter_arrival_ns.size(), "waiters and arrival times differ");
    if (e.state == RamState::kAbsent || (e.state == RamState::kResident && !e.device_layout))
      CHECK_MSG(e.waiters.empty(), "an expert with no load in progress has waiters");
    CHECK_MSG(!e.device_layout || (exclusive_ && e.state == RamState::kResident),
              "a device-layout copy without exclusive tiers, or not resident");
    CHECK_MSG(!e.prefetch_load || e.state == RamState::kLoading, "a prefetch load is not in flight");
    CHECK_MSG(!e.copying || e.state == RamState::kResident, "a copy into VRAM reads a slot not resident");
    const bool in_policy = policy_->Contains(PackExpertKey(ctx_.LayerOf(i), ctx_.ExpertOf(i)));
    CHECK_MSG(in_policy == (e.state == RamState::kResident), "the policy's keys are not the residents");
    loading += e.state == RamState::kLoading;
    prefetch_loading += e.state == RamState::kLoading && e.prefetch_load;
    queued += e.state == RamState::kQueued;
    resident += e.state == RamState::kResident;
  }
  CHECK_MSG(loading == inflight_ && prefetch_loading == prefetch_inflight_,
            "the reads in flight are not the loading experts");
  CHECK_MSG(inflight_ <= options_.io_inflight_max, "more reads in flight than io_inflight_max");
  CHECK_MSG(policy_->size() == resident, "the policy holds other keys than the residents");
  CHECK_MSG(static_cast<int64_t>(queued_.size()) == queued, "the load queue is not the queued experts");
  for (const uint32_t i : queued_) CHECK_MSG(experts_[i].state == RamState::kQueued, "a queued load is not queued");
}

}  // namespace mer::residency
