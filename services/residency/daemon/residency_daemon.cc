#include "services/residency/daemon/residency_daemon.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status.h"

namespace mer::residency {
namespace {

constexpr uint32_t kFreeOwner = 0xFFFFFFFFu;
constexpr uint64_t kMaxRegisteredBuffer = uint64_t{1} << 30;

}  // namespace

void ForEachCounter(const ResidencyCounters& c,
                    const std::function<void(const char*, uint64_t)>& fn) {
  fn("lookups", c.lookups);
  fn("hits", c.hits);
  fn("misses", c.misses);
  fn("coalesced", c.coalesced);
  fn("loads", c.loads);
  fn("load_failures", c.load_failures);
  fn("reads", c.reads);
  fn("bytes_read", c.bytes_read);
  fn("read_errors", c.read_errors);
  fn("checksum_failures", c.checksum_failures);
  fn("refetches", c.refetches);
  fn("evictions", c.evictions);
  fn("slot_waits", c.slot_waits);
  fn("hints", c.hints);
  fn("compute_hits", c.compute_hits);
  fn("prefetch_issued", c.prefetch_issued);
  fn("warm_loads", c.warm_loads);
  fn("prefetch_useful", c.prefetch_useful);
  fn("prefetch_wasted", c.prefetch_wasted);
  fn("read_latency_us_total", c.read_latency_us_total);
  fn("read_latency_us_max", c.read_latency_us_max);
  fn("completions_sent", c.completions_sent);
  fn("stall_ns_total", c.stall_ns_total);
  fn("stalled_completions", c.stalled_completions);
  fn("io_inflight", c.io_inflight);
  fn("slots_free", c.slots_free);
  fn("slots_resident", c.slots_resident);
  fn("slots_pinned", c.slots_pinned);
  fn("slots_loading", c.slots_loading);
  fn("vram_arena_imports", c.vram_arena_imports);
  fn("vram_arena_refusals", c.vram_arena_refusals);
  fn("vram_lookups", c.vram_lookups);
  fn("vram_hits", c.vram_hits);
  fn("vram_misses", c.vram_misses);
  fn("vram_refused", c.vram_refused);
  fn("vram_fills_from_ram", c.vram_fills_from_ram);
  fn("vram_fills_from_store", c.vram_fills_from_store);
  fn("vram_uploads", c.vram_uploads);
  fn("vram_upload_bytes", c.vram_upload_bytes);
  fn("vram_evictions", c.vram_evictions);
  fn("vram_slot_waits", c.vram_slot_waits);
  fn("vram_prefetch_issued", c.vram_prefetch_issued);
  fn("vram_prefetch_useful", c.vram_prefetch_useful);
  fn("vram_prefetch_wasted", c.vram_prefetch_wasted);
  fn("vram_slots", c.vram_slots);
  fn("vram_slots_free", c.vram_slots_free);
  fn("vram_slots_resident", c.vram_slots_resident);
  fn("vram_slots_pinned", c.vram_slots_pinned);
  fn("vram_slots_filling", c.vram_slots_filling);
}

std::string FormatCounters(const ResidencyCounters& c) {
  std::string s;
  ForEachCounter(c, [&](const char* name, uint64_t v) {
    absl::StrAppend(&s, s.empty() ? "" : " ", name, "=", v);
  });
  if (c.reads > 0) absl::StrAppend(&s, " read_latency_us_mean=", c.read_latency_us_total / c.reads);
  return s;
}

uint32_t RamSlotCount(const ExpertStore& store, const ResidencyOptions& options) {
  const uint64_t blob = std::max<uint64_t>(store.blob_bytes(), 1);
  const uint64_t total = uint64_t(store.n_layer()) * store.n_expert();
  uint64_t slots = options.ram_budget_bytes / blob;
  const uint64_t floor = std::max<uint64_t>(options.min_ram_slots, 1);
  slots = std::max(slots, floor);
  slots = std::min<uint64_t>(slots, std::max<uint64_t>(total, floor));
  slots = std::min<uint64_t>(slots, shm::kMaxSlots);
  return static_cast<uint32_t>(slots);
}

shm::SegmentGeometry DaemonGeometry(const ExpertStore& store, const ResidencyOptions& options) {
  shm::SegmentGeometry g;
  g.model_identity = shm::StoreSegmentIdentity(store.manifest());
  g.n_layer = static_cast<uint32_t>(store.n_layer());
  g.n_expert = static_cast<uint32_t>(store.n_expert());
  g.ram_slot_count = RamSlotCount(store, options);
  g.ram_slot_bytes = store.blob_bytes();
  // Pins for an arena of every expert (16 bytes a slot): compute sizes its arena, up to this.
  g.vram_slot_count = static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t(store.n_layer()) * store.n_expert(), shm::kMaxSlots));
  return g;
}

absl::StatusOr<std::unique_ptr<ResidencyDaemon>> ResidencyDaemon::Create(
    const ExpertStore& store, shm::ShmSegment* segment, std::unique_ptr<IoEngine> io,
    int experts_fd, const ResidencyOptions& options) {
  const shm::SegmentHeader& h = segment->header();
  if (segment->role() != shm::Role::kResidency)
    return absl::InvalidArgumentError("the segment is not held as the residency role");
  if (h.n_layer != static_cast<uint32_t>(store.n_layer()) ||
      h.n_expert != static_cast<uint32_t>(store.n_expert()))
    return absl::InvalidArgumentError("the segment's geometry is not the store's");
  if (h.ram_slot_count == 0 || h.ram_slot_bytes < store.blob_bytes())
    return absl::InvalidArgumentError(absl::StrCat("the segment's RAM slots (", h.ram_slot_count,
                                                   " x ", h.ram_slot_bytes,
                                                   " bytes) cannot hold blobs of ",
                                                   store.blob_bytes(), " bytes"));
  if (options.io_inflight_max < 1 || options.prefetch_inflight_max < 0 ||
      options.max_refetches < 0 || options.vram_upload_inflight_max < 1 ||
      options.vram_prefetch_inflight_max < 0)
    return absl::InvalidArgumentError(
        "io_inflight_max and vram_upload_inflight_max must be >= 1, the other limits >= 0");
  std::unique_ptr<ResidencyDaemon> d(
      new ResidencyDaemon(store, segment, std::move(io), experts_fd, options));
  ASSIGN_OR_RETURN(d->policy_, CreatePolicy(options.policy, d->n_slots_));
  if (options.prefetch)
    d->predictor_ = std::make_unique<PrefetchPredictor>(store.n_layer(), store.n_expert());
  // The slot pool as fixed buffers (READ_FIXED on io_uring), in pieces of at most 1 GiB cut at
  // slot boundaries. Shared memory may be refused (not anonymous memory): then plain reads.
  std::vector<IoBuffer> buffers;
  const uint64_t per = std::max<uint64_t>(1, kMaxRegisteredBuffer / h.ram_slot_bytes);
  for (uint32_t k = 0; k < h.ram_slot_count; k += per) {
    const uint64_t n = std::min<uint64_t>(per, h.ram_slot_count - k);
    buffers.push_back({segment->ram_slot(k).data(), static_cast<size_t>(n * h.ram_slot_bytes)});
  }
  d->buffers_registered_ = buffers.size() <= 16384 && d->io_->RegisterBuffers(buffers).ok();
  for (const StoreLayer& l : store.manifest().layers)
    d->max_used_bytes_ = std::max(d->max_used_bytes_, l.used_bytes());
  void* pool = segment->ram_slot(0).data();
  const uint64_t pool_bytes = uint64_t{h.ram_slot_count} * h.ram_slot_bytes;
  const int inflight = options.vram_upload_inflight_max;
  d->vram_factory_ = [pool, pool_bytes, inflight] {
    return CreateCudaVramUploader(pool, pool_bytes, inflight);
  };
  return d;
}

ResidencyDaemon::ResidencyDaemon(const ExpertStore& store, shm::ShmSegment* segment,
                                 std::unique_ptr<IoEngine> io, int experts_fd,
                                 const ResidencyOptions& options)
    : store_(store),
      segment_(segment),
      io_(std::move(io)),
      fd_(experts_fd),
      options_(options),
      n_layer_(segment->header().n_layer),
      n_expert_(segment->header().n_expert),
      n_slots_(segment->header().ram_slot_count),
      ep_(segment),
      experts_(size_t{n_layer_} * n_expert_),
      slot_owner_(n_slots_, kFreeOwner),
      submit_time_(size_t{n_layer_} * n_expert_) {
  free_slots_.reserve(n_slots_);
  touched_.reserve(n_slots_);
  for (uint32_t k = n_slots_; k-- > 0;) free_slots_.push_back(k);
  last_stats_print_ = absl::Now();
}

ResidencyDaemon::~ResidencyDaemon() {
  if (uploader_ != nullptr) uploader_->Close();  // copies from our RAM slots end first
}

ResidencyCounters ResidencyDaemon::Snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

void ResidencyDaemon::CensusSlots() {
  const shm::PeerInfo compute = segment_->Peer();
  shm::SlotPins& pins = ep_.pins(shm::Pool::kRam);
  uint64_t free = 0, resident = 0, pinned = 0, loading = 0;
  for (uint32_t k = 0; k < n_slots_; ++k) {
    const uint32_t owner = slot_owner_[k];
    if (pins.InUse(k, compute.incarnation, compute.gone)) {
      ++pinned;
    } else if (owner == kFreeOwner) {
      ++free;
    } else if (experts_[owner].loading) {
      ++loading;
    } else {
      ++resident;
    }
  }
  c_.slots_free = free;
  c_.slots_resident = resident;
  c_.slots_pinned = pinned;
  c_.slots_loading = loading;
  CensusVramSlots();
}

void ResidencyDaemon::Publish(bool census) {
  const absl::Time now = absl::Now();
  if (census || now - last_census_ >= kCensusInterval) {
    SyncComputeHits();  // compute's own hits reach the counters (and the policy) while idle too
    CensusSlots();
    last_census_ = now;
  }
  c_.io_inflight = static_cast<uint64_t>(inflight_);
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = c_;
}

void ResidencyDaemon::Complete(const shm::DemandRequest& d, uint32_t slot, uint64_t generation,
                               absl::StatusCode code, int64_t arrival_ns, shm::Pool pool) {
  shm::Completion c{};
  c.layer = d.layer;
  c.expert = d.expert;
  c.request_id = d.request_id;
  c.generation = generation;
  c.slot = slot;
  c.status = static_cast<uint16_t>(code);
  c.pool = static_cast<uint8_t>(pool);
  out_.push_back(c);
  out_arrival_ns_.push_back(arrival_ns);
}

void ResidencyDaemon::FlushCompletions() {
  while (!out_.empty()) {
    shm::Completion buf[64];
    const size_t n = std::min<size_t>(out_.size(), 64);
    std::copy(out_.begin(), out_.begin() + n, buf);
    const size_t k = ep_.completions().TryPushBatch(absl::MakeConstSpan(buf, n));
    out_.erase(out_.begin(), out_.begin() + k);
    c_.completions_sent += k;
    int64_t now_ns = 0;
    for (size_t j = 0; j < k; ++j) {
      const int64_t arrival = out_arrival_ns_[j];
      if (arrival == 0) continue;
      if (now_ns == 0) now_ns = absl::GetCurrentTimeNanos();
      c_.stall_ns_total += static_cast<uint64_t>(std::max<int64_t>(0, now_ns - arrival));
      ++c_.stalled_completions;
    }
    out_arrival_ns_.erase(out_arrival_ns_.begin(), out_arrival_ns_.begin() + k);
    if (k < n) break;  // ring full: the rest next turn
  }
}

void ResidencyDaemon::HandleDemand(const shm::DemandRequest& d, int64_t now_ns) {
  ++c_.lookups;
  if (!ep_.table().Contains(d.layer, d.expert)) return;  // hostile input: dropped
  if (d.pool == static_cast<uint8_t>(shm::Pool::kVram)) {
    HandleVramDemand(d, now_ns);
    return;
  }
  if (d.pool != static_cast<uint8_t>(shm::Pool::kRam)) {
    Complete(d, shm::kNoSlot, 0, absl::StatusCode::kInvalidArgument);  // hostile input
    return;
  }
  const uint32_t i = Index(d.layer, d.expert);
  Expert& e = experts_[i];
  if (e.slot != shm::kNoSlot && !e.loading) {
    const std::optional<shm::EntryState> s = ep_.table().Read(d.layer, d.expert);
    if (s.has_value() && s->in(shm::Pool::kRam) && s->ram_slot == e.slot) {
      ++c_.hits;
      const ExpertKey key = PackExpertKey(d.layer, d.expert);
      if (policy_->Contains(key)) policy_->Touch(key);
      if (e.prefetched) {
        e.prefetched = false;
        ++c_.prefetch_useful;
      }
      Complete(d, e.slot, s->generation, absl::StatusCode::kOk);
      return;
    }
  }
  ++c_.misses;
  if (e.prefetched) {  // demanded while its prefetch is in flight: it was a good guess
    e.prefetched = false;
    ++c_.prefetch_useful;
  }
  if (e.loading || e.load_queued) {
    ++c_.coalesced;
    e.waiters.push_back(d);
    e.waiter_arrival_ns.push_back(now_ns);
    return;
  }
  e.waiters.push_back(d);
  e.waiter_arrival_ns.push_back(now_ns);
  e.attempts = 0;
  e.load_queued = true;
  queued_.push_back(i);
}

std::optional<uint32_t> ResidencyDaemon::AllocateSlot(ExpertKey incoming, bool for_prefetch) {
  // A free slot no step can still read (R3).
  for (size_t j = free_slots_.size(); j-- > 0;) {
    const uint32_t k = free_slots_[j];
    if (ep_.SlotReusable(shm::Pool::kRam, k)) {
      free_slots_.erase(free_slots_.begin() + j);
      return k;
    }
  }
  // Evict the policy's victim among residents whose slot is not pinned.
  const shm::PeerInfo compute = segment_->Peer();
  shm::SlotPins& pins = ep_.pins(shm::Pool::kRam);
  for (int tries = 0; tries < 4; ++tries) {
    const std::optional<ExpertKey> victim = policy_->ChooseVictim(
        [&](ExpertKey key) {
          const Expert& v = experts_[Index(KeyLayer(key), KeyExpert(key))];
          // A copy into VRAM reads the RAM slot until it completes.
          return v.slot != shm::kNoSlot && !v.loading && !v.vram_filling &&
                 !pins.InUse(v.slot, compute.incarnation, compute.gone);
        },
        for_prefetch ? kNoKey : incoming);
    if (!victim.has_value()) return std::nullopt;
    const uint32_t vi = Index(KeyLayer(*victim), KeyExpert(*victim));
    Expert& v = experts_[vi];
    const uint32_t k = v.slot;
    ep_.EvictRam(KeyLayer(*victim), KeyExpert(*victim));  // R1 (and R2)
    policy_->Remove(*victim);
    ++c_.evictions;
    // The hits compute made since the last sync still count, and tell whether a prefetch was used.
    const bool hit_since_sync = TakeComputeHits(vi) > 0;
    if (v.prefetched) ++(hit_since_sync ? c_.prefetch_useful : c_.prefetch_wasted);
    v.prefetched = false;
    v.slot = shm::kNoSlot;
    slot_owner_[k] = kFreeOwner;
    if (ep_.SlotReusable(shm::Pool::kRam, k)) return k;  // R3
    free_slots_.push_back(k);  // pinned in between: reusable once unpinned
  }
  return std::nullopt;
}

absl::Status ResidencyDaemon::Submit(uint32_t index) {
  Expert& e = experts_[index];
  const int layer = static_cast<int>(index / n_expert_);
  const int expert = static_cast<int>(index % n_expert_);
  ReadRequest r;
  r.fd = fd_;
  r.offset = store_.BlobOffset(layer, expert);
  r.length = store_.blob_bytes();
  r.dest = segment_->ram_slot(e.slot).data();
  r.tag = index;
  RETURN_IF_ERROR(io_->Submit(absl::MakeConstSpan(&r, 1)));
  e.loading = true;
  submit_time_[index] = absl::Now();
  ++inflight_;
  if (e.prefetch_load) ++prefetch_inflight_;
  return absl::OkStatus();
}

uint64_t ResidencyDaemon::TakeComputeHits(uint32_t index) {
  Expert& e = experts_[index];
  const uint64_t hits =
      ep_.table().entry(index / n_expert_, index % n_expert_).hits.load(std::memory_order_relaxed);
  if (hits <= e.hits_seen) return 0;
  const uint64_t fresh = hits - e.hits_seen;
  e.hits_seen = hits;
  c_.compute_hits += fresh;
  return fresh;
}

void ResidencyDaemon::SyncComputeHits() {
  touched_.clear();
  for (uint32_t k = 0; k < n_slots_; ++k) {
    const uint32_t i = slot_owner_[k];
    if (i == kFreeOwner) continue;
    Expert& e = experts_[i];
    if (e.loading) continue;
    const uint64_t new_hits = TakeComputeHits(i);
    if (new_hits == 0) continue;
    const shm::ResidencyEntry& entry = ep_.table().entry(i / n_expert_, i % n_expert_);
    touched_.push_back({entry.last_use_epoch.load(std::memory_order_relaxed), i,
                        std::min<uint64_t>(new_hits, kMaxTouchesPerSync)});
    if (e.prefetched) {
      e.prefetched = false;
      ++c_.prefetch_useful;
    }
  }
  std::sort(touched_.begin(), touched_.end(),
            [](const TouchedExpert& a, const TouchedExpert& b) { return a.epoch < b.epoch; });
  for (const TouchedExpert& t : touched_) {
    const ExpertKey key = PackExpertKey(t.index / n_expert_, t.index % n_expert_);
    if (!policy_->Contains(key)) continue;
    for (uint64_t n = 0; n < t.touches; ++n) policy_->Touch(key);
  }
}

bool ResidencyDaemon::StartLoads() {
  bool progress = false;
  if (!queued_.empty()) SyncComputeHits();
  while (!queued_.empty() && inflight_ < options_.io_inflight_max) {
    const uint32_t i = queued_.front();
    Expert& e = experts_[i];
    const std::optional<uint32_t> slot =
        AllocateSlot(PackExpertKey(i / n_expert_, i % n_expert_), /*for_prefetch=*/false);
    if (!slot.has_value()) {
      ++c_.slot_waits;  // every slot pinned: wait for a Release
      break;
    }
    queued_.pop_front();
    e.load_queued = false;
    e.slot = *slot;
    e.prefetch_load = false;
    slot_owner_[*slot] = i;
    const absl::Status s = Submit(i);
    if (!s.ok()) {
      FinishLoad(i, s);
    }
    progress = true;
  }
  return progress;
}

void ResidencyDaemon::Prefetch(uint32_t layer, uint32_t expert) {
  if (!ep_.table().Contains(layer, expert)) return;
  if (prefetch_inflight_ >= options_.prefetch_inflight_max || inflight_ >= options_.io_inflight_max)
    return;
  const uint32_t i = Index(layer, expert);
  Expert& e = experts_[i];
  if (e.slot != shm::kNoSlot || e.loading || e.load_queued) return;
  const std::optional<uint32_t> slot = AllocateSlot(PackExpertKey(layer, expert), true);
  if (!slot.has_value()) return;  // never a pinned slot for a guess
  StartLoadAhead(i, *slot, /*guess=*/true);
}

void ResidencyDaemon::StartLoadAhead(uint32_t index, uint32_t slot, bool guess) {
  Expert& e = experts_[index];
  e.slot = slot;
  e.prefetch_load = guess;  // a guess counts against prefetch_inflight_max
  e.prefetched = guess;
  e.attempts = 0;
  slot_owner_[slot] = index;
  ++(guess ? c_.prefetch_issued : c_.warm_loads);
  const absl::Status s = Submit(index);
  if (!s.ok()) FinishLoad(index, s);
}

bool ResidencyDaemon::WarmRam() {
  const uint32_t total = static_cast<uint32_t>(experts_.size());
  if (warm_next_ >= total) return false;
  if (warm_next_ == 0 && warm_start_ == absl::Time()) {
    warm_start_ = absl::Now();
    warm_bytes_start_ = c_.bytes_read;
  }
  const int cap = std::max(1, options_.io_inflight_max - 2);  // room for demand reads
  bool started = false;
  while (warm_next_ < total && inflight_ < cap && !free_slots_.empty()) {
    const uint32_t i = warm_next_++;
    const uint32_t layer = i / n_expert_, expert = i % n_expert_;
    const Expert& e = experts_[i];
    if (!ep_.table().Contains(layer, expert) || e.slot != shm::kNoSlot || e.loading || e.load_queued) continue;
    const std::optional<uint32_t> slot = AllocateSlot(PackExpertKey(layer, expert), true);
    if (!slot.has_value()) break;
    StartLoadAhead(i, *slot, /*guess=*/false);
    started = true;
  }
  if (free_slots_.empty()) warm_next_ = total;  // done: the tier is full
  return started;
}

void ResidencyDaemon::ReportWarmed() {
  warm_reported_ = true;
  const double secs = absl::ToDoubleSeconds(absl::Now() - warm_start_);
  const double gb = double(c_.bytes_read - warm_bytes_start_) / 1e9;
  std::fprintf(stderr, "mer-residency: RAM tier warmed: %llu experts read, %.2f GB in %.1f s (%.2f GB/s)\n",
               static_cast<unsigned long long>(c_.warm_loads), gb, secs, secs > 0 ? gb / secs : 0.0);
}

void ResidencyDaemon::FinishLoad(uint32_t index, const absl::Status& status) {
  Expert& e = experts_[index];
  const uint32_t layer = index / n_expert_, expert = index % n_expert_;
  if (e.loading) {
    e.loading = false;
    --inflight_;
    if (e.prefetch_load) --prefetch_inflight_;
  }
  if (status.ok()) {
    const uint64_t g = PublishEntry(index);
    const ExpertKey key = PackExpertKey(layer, expert);
    e.hits_seen = ep_.table().entry(layer, expert).hits.load(std::memory_order_relaxed);
    if (e.prefetched && e.waiters.empty()) {
      policy_->AdmitPrefetched(key);
    } else {
      e.prefetched = false;
      policy_->Admit(key);
    }
    ++c_.loads;
    for (size_t w = 0; w < e.waiters.size(); ++w)
      Complete(e.waiters[w], e.slot, g, absl::StatusCode::kOk, e.waiter_arrival_ns[w]);
  } else {
    // Never publish what failed: the slot goes back, the waiters get the error.
    slot_owner_[e.slot] = kFreeOwner;
    free_slots_.push_back(e.slot);
    e.slot = shm::kNoSlot;
    if (e.prefetched && e.waiters.empty() && e.vram_waiters.empty()) {
      ++c_.prefetch_wasted;
    } else {
      ++c_.load_failures;
      if (e.vram_slot != shm::kNoSlot && !e.vram_filling) {
        // The failed entry shows no tier: the VRAM copy is unpublished too, and its slot free
        // once unpinned (R3 is checked when it is taken again).
        vram_map_.Release(e.vram_slot);
        e.vram_slot = shm::kNoSlot;
      }
      const uint64_t g = ep_.PublishFailed(layer, expert, status.code());
      std::fprintf(stderr, "mer-residency: layer %u expert %u: %s\n", layer, expert,
                   std::string(status.message()).c_str());
      for (size_t w = 0; w < e.waiters.size(); ++w)
        Complete(e.waiters[w], shm::kNoSlot, g, status.code(), e.waiter_arrival_ns[w]);
      FailVramWaiters(index, status.code());
    }
    e.prefetched = false;
  }
  e.waiters.clear();
  e.waiter_arrival_ns.clear();
  e.prefetch_load = false;
}

absl::Status ResidencyDaemon::Reap() {
  if (io_->outstanding() == 0) return absl::OkStatus();
  reaped_.clear();
  ASSIGN_OR_RETURN(const int n, io_->Wait(0, absl::ZeroDuration(), &reaped_));
  const absl::Time now = absl::Now();
  for (int j = 0; j < n; ++j) {
    const ReadCompletion& rc = reaped_[j];
    const uint32_t i = static_cast<uint32_t>(rc.tag);
    if (i >= experts_.size() || !experts_[i].loading) continue;
    Expert& e = experts_[i];
    const int layer = static_cast<int>(i / n_expert_), expert = static_cast<int>(i % n_expert_);
    ++c_.reads;
    c_.bytes_read += rc.bytes;
    const absl::Duration latency = now - submit_time_[i];
    const uint64_t us = static_cast<uint64_t>(absl::ToInt64Microseconds(latency));
    const double seconds = absl::ToDoubleSeconds(latency);
    c_.read_latency_seconds_total += seconds;
    size_t bucket = 0;
    while (bucket < kReadLatencyBucketsSeconds.size() && seconds > kReadLatencyBucketsSeconds[bucket])
      ++bucket;
    ++c_.read_latency_buckets[bucket];
    c_.read_latency_us_total += us;
    c_.read_latency_us_max = std::max(c_.read_latency_us_max, us);
    absl::Status s = rc.status;
    if (!s.ok()) {
      ++c_.read_errors;
      s = absl::Status(s.code(), absl::StrCat("reading layer ", layer, " expert ", expert, ": ",
                                              s.message()));
    } else {
      s = store_.VerifyBlob(layer, expert, segment_->ram_slot(e.slot).data());
      if (!s.ok()) ++c_.checksum_failures;
    }
    if (!s.ok() && e.attempts < options_.max_refetches) {
      ++e.attempts;
      ++c_.refetches;
      e.loading = false;
      --inflight_;
      if (e.prefetch_load) --prefetch_inflight_;
      const absl::Status again = Submit(i);
      if (again.ok()) continue;
      s = again;
    }
    FinishLoad(i, s);
  }
  return absl::OkStatus();
}

void ResidencyDaemon::HandleHints() {
  shm::Hint hints[16];
  const size_t n = ep_.hints().PopBatch(absl::MakeSpan(hints));
  c_.hints += n;
  const bool vram = vram_open_ && options_.vram_prefetch;
  if (!options_.prefetch && !vram) return;
  if (n > 0 && options_.prefetch) SyncComputeHits();
  std::vector<int32_t> experts;
  std::vector<uint8_t> seen(n_expert_, 0);
  for (size_t h = 0; h < n; ++h) {
    const shm::Hint& hint = hints[h];
    if (hint.layer >= n_layer_) continue;
    // Untrusted: distinct ids in range only.
    experts.clear();
    const int count = std::min<int>(hint.count, 16);
    for (int j = 0; j < count; ++j) {
      const uint32_t e = hint.experts[j];
      if (e < n_expert_ && !seen[e]) {
        seen[e] = 1;
        experts.push_back(static_cast<int32_t>(e));
      }
    }
    for (int32_t e : experts) seen[e] = 0;
    const bool demand_waiting = DemandWaiting();
    if (hint.kind == 1) {  // predicted by compute
      if (demand_waiting) continue;
      const int vram_min = static_cast<int>(options_.vram_prefetch_threshold * 255.0 + 0.5);
      for (int j = 0; j < count; ++j) {
        const uint32_t e = hint.experts[j];
        if (e >= n_expert_) continue;
        if (options_.prefetch) Prefetch(hint.layer, e);
        if (vram && hint.confidence[j] >= vram_min) VramPrefetch(hint.layer, e);
      }
      continue;
    }
    if (predictor_ == nullptr) continue;
    predictor_->Observe(static_cast<int>(hint.layer), experts);
    last_hint_layer_ = static_cast<int>(hint.layer);
    if (demand_waiting) continue;
    for (int ahead = 1; ahead <= options_.prefetch_lookahead_layers; ++ahead) {
      const int next = (last_hint_layer_ + ahead) % static_cast<int>(n_layer_);
      predictor_->Predict(next, options_.prefetch_threshold, options_.prefetch_max_per_hint,
                          &predictions_);
      for (const ExpertPrediction& p : predictions_) {
        Prefetch(next, static_cast<uint32_t>(p.expert));
        if (vram && ahead == 1 && p.confidence >= options_.vram_prefetch_threshold)
          VramPrefetch(next, static_cast<uint32_t>(p.expert));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The VRAM tier.

uint64_t ResidencyDaemon::PublishEntry(uint32_t index) {
  const Expert& e = experts_[index];
  const uint32_t ram = e.slot != shm::kNoSlot && !e.loading ? e.slot : shm::kNoSlot;
  const uint32_t vram = e.vram_slot != shm::kNoSlot && !e.vram_filling ? e.vram_slot : shm::kNoSlot;
  return ep_.PublishResident(index / n_expert_, index % n_expert_, ram, vram, e.vram_fill);
}

bool ResidencyDaemon::DemandWaiting() {
  return !queued_.empty() || !vram_queue_.empty() || ep_.demand().SizeApprox() > 0;
}

void ResidencyDaemon::FailVramWaiters(uint32_t index, absl::StatusCode code) {
  Expert& e = experts_[index];
  for (size_t w = 0; w < e.vram_waiters.size(); ++w)
    Complete(e.vram_waiters[w], shm::kNoSlot, 0, code, e.vram_waiter_arrival_ns[w], shm::Pool::kVram);
  e.vram_waiters.clear();
  e.vram_waiter_arrival_ns.clear();
  e.vram_queued = false;  // vram_queue_ skips it from now on
}

void ResidencyDaemon::DropVramArena(const char* why) {
  if (!vram_open_) return;
  std::fprintf(stderr, "mer-residency: VRAM arena closed: %s\n", why);
  if (uploader_ != nullptr) uploader_->Close();  // waits for the copies in flight
  vram_open_ = false;
  vram_prefetch_inflight_ = 0;
  for (uint32_t i = 0; i < experts_.size(); ++i) {
    Expert& e = experts_[i];
    if (e.vram_slot == shm::kNoSlot && e.vram_waiters.empty() && !e.vram_queued) continue;
    const bool published = e.vram_slot != shm::kNoSlot && !e.vram_filling;
    if (e.vram_prefetched) ++c_.vram_prefetch_wasted;
    e.vram_slot = shm::kNoSlot;
    e.vram_filling = e.vram_prefetched = e.vram_prefetch_load = false;
    e.vram_fill = 0;
    // Placements in an arena that is gone must not outlive it in the table.
    if (published) PublishEntry(i);
    FailVramWaiters(i, absl::StatusCode::kUnavailable);
  }
  vram_queue_.clear();
  vram_map_.Reset(0);
}

void ResidencyDaemon::PollVramArena() {
  const shm::PeerInfo compute = segment_->Peer();
  // An arena dies with the compute that exported it (its memory is freed with the process).
  if (vram_open_ && (compute.incarnation != vram_incarnation_ || compute.gone))
    DropVramArena("the compute that exported it is gone or restarted");
  const std::optional<shm::VramArenaRead> r = shm::ReadVramArena(
      ep_.vram_arena(), compute.incarnation, segment_->header().vram_slot_count);
  if (!r.has_value()) return;
  if (r->sequence == vram_acted_sequence_ && compute.incarnation == vram_acted_incarnation_) return;
  vram_acted_sequence_ = r->sequence;
  vram_acted_incarnation_ = compute.incarnation;
  if (absl::IsNotFound(r->info.status())) {
    DropVramArena("compute withdrew it");
    shm::AckVramArena(ep_.vram_arena(), r->sequence, absl::StatusCode::kOk);
    return;
  }
  DropVramArena("compute exported another arena");
  absl::Status s = r->info.status();
  if (s.ok() && r->info->slot_bytes < max_used_bytes_)
    s = absl::InvalidArgumentError(absl::StrCat("its slots of ", r->info->slot_bytes,
                                                " bytes are smaller than the store's experts (",
                                                max_used_bytes_, " bytes)"));
  if (s.ok() && uploader_ == nullptr) {
    absl::StatusOr<std::unique_ptr<VramUploader>> u = vram_factory_();
    if (u.ok()) {
      uploader_ = std::move(*u);
    } else {
      s = u.status();
    }
  }
  if (s.ok()) s = uploader_->Import(*r->info);
  if (!s.ok()) {
    ++c_.vram_arena_refusals;
    vram_refusal_ = s.code();
    std::fprintf(stderr, "mer-residency: VRAM arena of compute %llu refused: %s\n",
                 static_cast<unsigned long long>(compute.incarnation), s.ToString().c_str());
    shm::AckVramArena(ep_.vram_arena(), r->sequence, s.code());
    return;
  }
  vram_map_.Reset(r->info->slot_count);
  vram_open_ = true;
  vram_incarnation_ = compute.incarnation;
  ++c_.vram_arena_imports;
  std::fprintf(stderr, "mer-residency: VRAM arena imported: %s\n", uploader_->Describe().c_str());
  // The table holds no placement in it yet (DropVramArena cleared the last arena's): compute may
  // use it from the acknowledgement on.
  shm::AckVramArena(ep_.vram_arena(), r->sequence, absl::StatusCode::kOk);
}

void ResidencyDaemon::HandleVramDemand(const shm::DemandRequest& d, int64_t now_ns) {
  ++c_.vram_lookups;
  if (!vram_open_) {
    ++c_.vram_refused;
    Complete(d, shm::kNoSlot, 0, vram_refusal_, 0, shm::Pool::kVram);
    return;
  }
  const uint32_t i = Index(d.layer, d.expert);
  Expert& e = experts_[i];
  if (e.vram_prefetched) {  // demanded: the guess was good (resident or still filling)
    e.vram_prefetched = false;
    ++c_.vram_prefetch_useful;
  }
  if (e.vram_slot != shm::kNoSlot && !e.vram_filling) {
    const std::optional<shm::EntryState> st = ep_.table().Read(d.layer, d.expert);
    if (st.has_value() && st->in(shm::Pool::kVram) && st->vram_slot == e.vram_slot) {
      ++c_.vram_hits;
      vram_map_.Touch(e.vram_slot, segment_->control().compute_epoch.load(std::memory_order_relaxed));
      Complete(d, e.vram_slot, st->generation, absl::StatusCode::kOk, 0, shm::Pool::kVram);
      return;
    }
  }
  ++c_.vram_misses;
  if (e.vram_filling || e.vram_queued) ++c_.coalesced;
  e.vram_waiters.push_back(d);
  e.vram_waiter_arrival_ns.push_back(now_ns);
  if (e.vram_filling || e.vram_queued) return;
  e.vram_queued = true;
  vram_queue_.push_back(i);
  // The fill reads the RAM tier: a hit there, or a read from the store first.
  ++(e.slot != shm::kNoSlot && !e.loading ? c_.vram_fills_from_ram : c_.vram_fills_from_store);
}

std::optional<uint32_t> ResidencyDaemon::AllocateVramSlot(uint64_t used_before) {
  const shm::PeerInfo compute = segment_->Peer();
  shm::SlotPins& pins = ep_.pins(shm::Pool::kVram);
  const auto in_use = [&](uint32_t k) { return pins.InUse(k, compute.incarnation, compute.gone); };
  const auto pin_epoch = [&](uint32_t k) { return pins.LastEpoch(k); };
  for (int tries = 0; tries < 4; ++tries) {
    const std::optional<uint32_t> k = vram_map_.Candidate(in_use, pin_epoch, used_before);
    if (!k.has_value()) return std::nullopt;
    const uint32_t owner = vram_map_.owner(*k);
    if (owner == VramSlotMap::kFree) return k;  // free and unpinned (checked by Candidate)
    Expert& v = experts_[owner];
    if (v.vram_prefetched) ++(VramPrefetchUsed(owner) ? c_.vram_prefetch_useful : c_.vram_prefetch_wasted);
    v.vram_prefetched = false;
    v.vram_slot = shm::kNoSlot;
    v.vram_fill = 0;
    PublishEntry(owner);  // R1, R2 (Write ends with a seq_cst fence)
    vram_map_.Release(*k);
    ++c_.vram_evictions;
    if (!in_use(*k)) return k;  // R3
    // Pinned in between: free now, reusable once unpinned.
  }
  return std::nullopt;
}

bool ResidencyDaemon::VramPrefetchUsed(uint32_t index) {
  const Expert& e = experts_[index];
  if (e.vram_slot == shm::kNoSlot || e.vram_filling) return false;
  return ep_.pins(shm::Pool::kVram).LastEpoch(e.vram_slot) > e.vram_fill_epoch;
}

bool ResidencyDaemon::StartVramUpload(uint32_t index, bool prefetch) {
  Expert& e = experts_[index];
  const uint64_t used_before =
      prefetch ? ep_.MinInflightEpoch() : std::numeric_limits<uint64_t>::max();
  const std::optional<uint32_t> slot = AllocateVramSlot(used_before);
  if (!slot.has_value()) {
    if (!prefetch) ++c_.vram_slot_waits;
    return false;
  }
  const uint32_t layer = index / n_expert_;
  const uint64_t bytes = store_.manifest().layers[layer].used_bytes();
  const absl::Status s = uploader_->Start(*slot, segment_->ram_slot(e.slot).data(), bytes, index);
  if (!s.ok()) {
    std::fprintf(stderr, "mer-residency: upload of layer %u expert %u into VRAM: %s\n", layer,
                 index % n_expert_, s.ToString().c_str());
    if (!prefetch) FailVramWaiters(index, s.code());
    return !prefetch;  // a demand is answered (with the error); a prefetch just does not happen
  }
  vram_map_.Fill(*slot, index, segment_->control().compute_epoch.load(std::memory_order_relaxed));
  e.vram_slot = *slot;
  e.vram_filling = true;
  e.vram_prefetch_load = prefetch;
  e.vram_prefetched = prefetch;
  if (prefetch) {
    ++vram_prefetch_inflight_;
    ++c_.vram_prefetch_issued;
  }
  return true;
}

bool ResidencyDaemon::StartVramUploads() {
  if (!vram_open_ || vram_queue_.empty()) return false;
  bool progress = false;
  // Demand order, skipping (and keeping) experts whose RAM copy is not there yet.
  for (size_t j = 0; j < vram_queue_.size() && uploader_->inflight() < uploader_->max_inflight();) {
    const uint32_t i = vram_queue_[j];
    Expert& e = experts_[i];
    if (!e.vram_queued) {  // answered meanwhile (a failed load)
      vram_queue_.erase(vram_queue_.begin() + j);
      continue;
    }
    if (e.slot == shm::kNoSlot || e.loading) {
      if (!e.loading && !e.load_queued) {  // a RAM load first, with no RAM waiter of its own
        e.attempts = 0;
        e.load_queued = true;
        queued_.push_back(i);
        progress = true;
      }
      ++j;
      continue;
    }
    if (!StartVramUpload(i, /*prefetch=*/false)) break;  // every slot pinned or filling: later
    e.vram_queued = false;
    vram_queue_.erase(vram_queue_.begin() + j);
    progress = true;
  }
  return progress;
}

void ResidencyDaemon::PollVramUploads() {
  if (!vram_open_ || uploader_->inflight() == 0) return;
  vram_done_.clear();
  if (const absl::Status s = uploader_->Poll(&vram_done_); !s.ok()) {
    std::fprintf(stderr, "mer-residency: %s\n", s.ToString().c_str());
    vram_refusal_ = absl::StatusCode::kInternal;
    DropVramArena("an upload failed");
    return;
  }
  const uint64_t epoch = segment_->control().compute_epoch.load(std::memory_order_relaxed);
  for (uint64_t tag : vram_done_) {
    const uint32_t i = static_cast<uint32_t>(tag);
    if (i >= experts_.size() || !experts_[i].vram_filling) continue;
    Expert& e = experts_[i];
    // The copy is complete (its event has passed): only now may compute learn of it.
    e.vram_filling = false;
    vram_map_.Filled(e.vram_slot);
    e.vram_fill = ++vram_fill_counter_;
    e.vram_fill_epoch = epoch;
    if (e.vram_prefetch_load) --vram_prefetch_inflight_;
    e.vram_prefetch_load = false;
    const uint64_t g = PublishEntry(i);
    ++c_.vram_uploads;
    c_.vram_upload_bytes += store_.manifest().layers[i / n_expert_].used_bytes();
    for (size_t w = 0; w < e.vram_waiters.size(); ++w)
      Complete(e.vram_waiters[w], e.vram_slot, g, absl::StatusCode::kOk, e.vram_waiter_arrival_ns[w],
               shm::Pool::kVram);
    e.vram_waiters.clear();
    e.vram_waiter_arrival_ns.clear();
  }
}

void ResidencyDaemon::VramPrefetch(uint32_t layer, uint32_t expert) {
  if (!vram_open_ || !ep_.table().Contains(layer, expert)) return;
  if (vram_prefetch_inflight_ >= options_.vram_prefetch_inflight_max ||
      uploader_->inflight() >= uploader_->max_inflight() || DemandWaiting())
    return;
  const uint32_t i = Index(layer, expert);
  Expert& e = experts_[i];
  // Only what RAM holds already: a guess never costs a storage read here (the RAM prefetch
  // decides those), and never a pinned or recently used VRAM slot (AllocateVramSlot).
  if (e.vram_slot != shm::kNoSlot || e.vram_queued || e.slot == shm::kNoSlot || e.loading) return;
  StartVramUpload(i, /*prefetch=*/true);
}

void ResidencyDaemon::CensusVramSlots() {
  const uint32_t n = vram_map_.size();
  c_.vram_slots = n;
  if (n == 0) {
    c_.vram_slots_free = c_.vram_slots_resident = c_.vram_slots_pinned = c_.vram_slots_filling = 0;
    return;
  }
  const shm::PeerInfo compute = segment_->Peer();
  shm::SlotPins& pins = ep_.pins(shm::Pool::kVram);
  uint64_t free = 0, resident = 0, pinned = 0, filling = 0;
  for (uint32_t k = 0; k < n; ++k) {
    if (pins.InUse(k, compute.incarnation, compute.gone)) {
      ++pinned;
    } else if (vram_map_.filling(k)) {
      ++filling;
    } else if (vram_map_.owner(k) == VramSlotMap::kFree) {
      ++free;
    } else {
      ++resident;
    }
    // A prefetched expert compute pinned without asking was a good guess.
    const uint32_t owner = vram_map_.owner(k);
    if (owner != VramSlotMap::kFree && experts_[owner].vram_prefetched && VramPrefetchUsed(owner)) {
      experts_[owner].vram_prefetched = false;
      ++c_.vram_prefetch_useful;
    }
  }
  c_.vram_slots_free = free;
  c_.vram_slots_resident = resident;
  c_.vram_slots_pinned = pinned;
  c_.vram_slots_filling = filling;
}

absl::StatusOr<bool> ResidencyDaemon::Turn() {
  bool progress = false;
  const uint64_t sent_before = c_.completions_sent;
  const uint64_t vram_before = c_.vram_uploads + c_.vram_arena_imports + c_.vram_arena_refusals;
  // 0. An arena exported (or gone) since the last turn.
  PollVramArena();
  // 1. Demand first.
  shm::DemandRequest buf[64];
  for (int rounds = 0; rounds < 16; ++rounds) {
    const size_t n = ep_.demand().PopBatch(absl::MakeSpan(buf));
    const int64_t now_ns = n > 0 ? absl::GetCurrentTimeNanos() : 0;
    for (size_t j = 0; j < n; ++j) HandleDemand(buf[j], now_ns);
    if (n > 0) progress = true;
    if (n < 64) break;
  }
  FlushCompletions();
  // 2. Loads for the misses, and uploads of demanded experts that RAM holds.
  if (StartVramUploads()) progress = true;
  if (StartLoads()) progress = true;
  // 3. Finished reads and copies; uploads of what they brought into RAM.
  const uint64_t reads_before = c_.reads;
  RETURN_IF_ERROR(Reap());
  if (c_.reads != reads_before) progress = true;
  PollVramUploads();
  if (StartVramUploads()) progress = true;
  if (c_.vram_uploads + c_.vram_arena_imports + c_.vram_arena_refusals != vram_before) progress = true;
  FlushCompletions();
  // 4. Hints, and prefetch while no demand waits; then warming.
  const uint64_t hints_before = c_.hints;
  HandleHints();
  if (c_.hints != hints_before) progress = true;
  if (options_.warm && !DemandWaiting() && WarmRam()) progress = true;
  if (options_.warm && !warm_reported_ && warm_next_ >= experts_.size() && io_->outstanding() == 0) ReportWarmed();
  // Completions of reads reaped by Run's blocking wait are pushed here: progress too.
  if (c_.completions_sent != sent_before) progress = true;
  if (progress) Publish();
  return progress;
}

absl::Status ResidencyDaemon::Run(const std::atomic<bool>& stop) {
  segment_->StartHeartbeat(options_.heartbeat_interval);
  absl::Status status;
  while (!stop.load(std::memory_order_relaxed)) {
    loop_turns_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<bool> progress = Turn();
    if (!progress.ok()) {
      status = progress.status();
      break;
    }
    if (!*progress) {
      if (uploader_ != nullptr && uploader_->inflight() > 0) {
        absl::SleepFor(absl::Microseconds(20));  // a copy lands within ~100 us: poll it soon
      } else if (io_->outstanding() > 0) {
        // A read takes milliseconds: wait for it on the demand ring, so that a demand arriving
        // meanwhile is served at once rather than after the read (the next turn reaps it).
        ep_.demand().WaitForData(kReadPollInterval);
      } else if (out_.empty() && queued_.empty()) {
        ep_.demand().WaitForData(options_.idle_wait);
      } else {
        absl::SleepFor(absl::Microseconds(50));  // waiting for an unpin or ring space
      }
    }
    if (absl::Now() - last_census_ >= kCensusInterval) Publish();  // pins change while idle too
    if (options_.stats_interval > absl::ZeroDuration() &&
        absl::Now() - last_stats_print_ >= options_.stats_interval) {
      last_stats_print_ = absl::Now();
      std::fprintf(stderr, "mer-residency: %s\n", FormatCounters(c_).c_str());
    }
  }
  // Drain reads in flight (their destinations are our slots).
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (io_->outstanding() > 0 && absl::Now() < deadline) {
    reaped_.clear();
    if (!io_->Wait(1, absl::Milliseconds(10), &reaped_).ok()) break;
  }
  if (uploader_ != nullptr) uploader_->Close();  // copies read our RAM slots
  Publish(/*census=*/true);
  return status;
}

}  // namespace mer::residency
