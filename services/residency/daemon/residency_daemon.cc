#include "services/residency/daemon/residency_daemon.h"

#include <algorithm>
#include <cstdio>

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
  g.model_identity = SegmentIdentity(store.manifest());
  g.n_layer = static_cast<uint32_t>(store.n_layer());
  g.n_expert = static_cast<uint32_t>(store.n_expert());
  g.ram_slot_count = RamSlotCount(store, options);
  g.ram_slot_bytes = store.blob_bytes();
  g.vram_slot_count = 0;
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
      options.max_refetches < 0)
    return absl::InvalidArgumentError("io_inflight_max must be >= 1, the other limits >= 0");
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

ResidencyDaemon::~ResidencyDaemon() = default;

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
                               absl::StatusCode code, int64_t arrival_ns) {
  shm::Completion c{};
  c.layer = d.layer;
  c.expert = d.expert;
  c.request_id = d.request_id;
  c.generation = generation;
  c.slot = slot;
  c.status = static_cast<uint16_t>(code);
  c.pool = static_cast<uint8_t>(shm::Pool::kRam);
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
  if (d.pool != static_cast<uint8_t>(shm::Pool::kRam)) {
    Complete(d, shm::kNoSlot, 0, absl::StatusCode::kUnimplemented);  // no VRAM tier here
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
  if (e.loading || !e.waiters.empty()) {
    ++c_.coalesced;
    e.waiters.push_back(d);
    e.waiter_arrival_ns.push_back(now_ns);
    return;
  }
  e.waiters.push_back(d);
  e.waiter_arrival_ns.push_back(now_ns);
  e.attempts = 0;
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
          return v.slot != shm::kNoSlot && !v.loading &&
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
  if (e.slot != shm::kNoSlot || e.loading || !e.waiters.empty()) return;
  const std::optional<uint32_t> slot = AllocateSlot(PackExpertKey(layer, expert), true);
  if (!slot.has_value()) return;  // never a pinned slot for a guess
  e.slot = *slot;
  e.prefetch_load = true;
  e.prefetched = true;
  e.attempts = 0;
  slot_owner_[*slot] = i;
  ++c_.prefetch_issued;
  const absl::Status s = Submit(i);
  if (!s.ok()) FinishLoad(i, s);
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
    const uint64_t g = ep_.PublishResident(layer, expert, e.slot);
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
    if (e.prefetched && e.waiters.empty()) {
      ++c_.prefetch_wasted;
    } else {
      ++c_.load_failures;
      const uint64_t g = ep_.PublishFailed(layer, expert, status.code());
      std::fprintf(stderr, "mer-residency: layer %u expert %u: %s\n", layer, expert,
                   std::string(status.message()).c_str());
      for (size_t w = 0; w < e.waiters.size(); ++w)
        Complete(e.waiters[w], shm::kNoSlot, g, status.code(), e.waiter_arrival_ns[w]);
    }
    e.prefetched = false;
  }
  e.waiters.clear();
  e.waiter_arrival_ns.clear();
  e.prefetch_load = false;
}

absl::Status ResidencyDaemon::Reap(bool block) {
  if (io_->outstanding() == 0) return absl::OkStatus();
  reaped_.clear();
  ASSIGN_OR_RETURN(const int n, io_->Wait(block ? 1 : 0, block ? options_.idle_wait
                                                              : absl::ZeroDuration(),
                                          &reaped_));
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
  if (!options_.prefetch) return;
  if (n > 0) SyncComputeHits();
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
    const bool demand_waiting = !queued_.empty() || ep_.demand().SizeApprox() > 0;
    if (hint.kind == 1) {  // predicted by compute
      if (!demand_waiting)
        for (int32_t e : experts) Prefetch(hint.layer, static_cast<uint32_t>(e));
      continue;
    }
    predictor_->Observe(static_cast<int>(hint.layer), experts);
    last_hint_layer_ = static_cast<int>(hint.layer);
    if (demand_waiting) continue;
    for (int ahead = 1; ahead <= options_.prefetch_lookahead_layers; ++ahead) {
      const int next = (last_hint_layer_ + ahead) % static_cast<int>(n_layer_);
      predictor_->Predict(next, options_.prefetch_threshold, options_.prefetch_max_per_hint,
                          &predictions_);
      for (const ExpertPrediction& p : predictions_) Prefetch(next, static_cast<uint32_t>(p.expert));
    }
  }
}

absl::StatusOr<bool> ResidencyDaemon::Turn() {
  bool progress = false;
  const uint64_t sent_before = c_.completions_sent;
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
  // 2. Loads for the misses.
  if (StartLoads()) progress = true;
  // 3. Finished reads.
  const uint64_t reads_before = c_.reads;
  RETURN_IF_ERROR(Reap(/*block=*/false));
  if (c_.reads != reads_before) progress = true;
  FlushCompletions();
  // 4. Hints, and prefetch while no demand waits.
  const uint64_t hints_before = c_.hints;
  HandleHints();
  if (c_.hints != hints_before) progress = true;
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
      if (io_->outstanding() > 0) {
        const uint64_t reads_before = c_.reads;
        status = Reap(/*block=*/true);
        if (!status.ok()) break;
        if (c_.reads != reads_before) Publish();
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
  Publish(/*census=*/true);
  return status;
}

}  // namespace mer::residency
