#include "services/residency/daemon/residency_daemon.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/cpu_relax.h"
#include "common/base/status.h"
#include "common/shm/store_identity.h"

namespace mer::residency {

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

absl::Status CheckExpertShare(const ResidencyOptions& o) {
  if (o.expert_share_ranks < 1 || o.expert_share_rank < 0 || o.expert_share_rank >= o.expert_share_ranks)
    return absl::InvalidArgumentError(absl::StrCat("expert share ", o.expert_share_rank, "/", o.expert_share_ranks,
                                                   ": the rank must be in [0, ranks)"));
  return absl::OkStatus();
}

shm::SegmentGeometry DaemonGeometry(const ExpertStore& store, const ResidencyOptions& options) {
  shm::SegmentGeometry g;
  g.model_identity = shm::StoreSegmentIdentity(store.manifest());
  g.n_layer = static_cast<uint32_t>(store.n_layer());
  g.n_expert = static_cast<uint32_t>(store.n_expert());
  g.ram_slot_count = RamSlotCount(store, options);
  g.ram_slot_bytes = store.blob_bytes();
  // Pins for an arena of every expert (16 bytes a slot): compute sizes its arena, up to this.
  g.vram_slot_count =
      static_cast<uint32_t>(std::min<uint64_t>(uint64_t(store.n_layer()) * store.n_expert(), shm::kMaxSlots));
  return g;
}

absl::StatusOr<std::unique_ptr<ResidencyDaemon>> ResidencyDaemon::Create(const ExpertStore& store,
                                                                         shm::ShmSegment* segment,
                                                                         std::unique_ptr<IoEngine> io, int experts_fd,
                                                                         const ResidencyOptions& options,
                                                                         const Clock* clock) {
  const shm::SegmentHeader& h = segment->header();
  if (segment->role() != shm::Role::kResidency)
    return absl::InvalidArgumentError("the segment is not held as the residency role");
  if (h.n_layer != static_cast<uint32_t>(store.n_layer()) || h.n_expert != static_cast<uint32_t>(store.n_expert()))
    return absl::InvalidArgumentError("the segment's geometry is not the store's");
  if (h.ram_slot_count == 0 || h.ram_slot_bytes < store.blob_bytes())
    return absl::InvalidArgumentError(absl::StrCat("the segment's RAM slots (", h.ram_slot_count, " x ",
                                                   h.ram_slot_bytes, " bytes) cannot hold blobs of ",
                                                   store.blob_bytes(), " bytes"));
  if (options.io_inflight_max < 1 || options.prefetch_inflight_max < 0 || options.max_refetches < 0 ||
      options.vram_upload_inflight_max < 1 || options.vram_prefetch_inflight_max < 0)
    return absl::InvalidArgumentError(
        "io_inflight_max and vram_upload_inflight_max must be >= 1, the other limits >= 0");
  RETURN_IF_ERROR(CheckExpertShare(options));
  ASSIGN_OR_RETURN(std::unique_ptr<ReplacementPolicy> policy, CreatePolicy(options.policy, h.ram_slot_count));
  uint64_t max_used_bytes = 0;
  for (const StoreLayer& l : store.manifest().layers) max_used_bytes = std::max(max_used_bytes, l.used_bytes());
  void* pool = segment->ram_slot(0).data();
  const uint64_t pool_bytes = uint64_t{h.ram_slot_count} * h.ram_slot_bytes;
  const int inflight = options.vram_upload_inflight_max;
  VramUploaderFactory vram_factory = [pool, pool_bytes, inflight] {
    return CreateCudaVramUploader(pool, pool_bytes, inflight);
  };
  std::unique_ptr<ResidencyDaemon> d(new ResidencyDaemon(store, segment, std::move(io), experts_fd, options, *clock,
                                                         std::move(policy), max_used_bytes, std::move(vram_factory)));
  if (options.prefetch) d->predictor_ = std::make_unique<PrefetchPredictor>(store.n_layer(), store.n_expert());
  d->buffers_registered_ = d->ram_.RegisterBuffers();
  return d;
}

ResidencyDaemon::ResidencyDaemon(const ExpertStore& store, shm::ShmSegment* segment, std::unique_ptr<IoEngine> io,
                                 int experts_fd, const ResidencyOptions& options, const Clock& clock,
                                 std::unique_ptr<ReplacementPolicy> policy, uint64_t max_used_bytes,
                                 VramUploaderFactory vram_factory)
    : options_(options),
      io_(std::move(io)),
      ctx_(store, segment, clock),
      ram_(ctx_, *io_, experts_fd, options_, std::move(policy)),
      vram_(ctx_, options_, max_used_bytes, std::move(vram_factory)) {
  ctx_.ram = &ram_;
  ctx_.vram = &vram_;
  last_stats_print_ = clock.Now();
}

ResidencyCounters ResidencyDaemon::Snapshot() const {
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  return snapshot_;
}

void ResidencyDaemon::Publish(bool census) {
  const absl::Time now = ctx_.clock.Now();
  if (census || now - last_census_ >= kCensusInterval) {
    ram_.SyncComputeHits();  // compute's own hits reach the counters (and the policy) while idle too
    ram_.Census();
    vram_.Census();
    if (options_.check_invariants) CheckInvariants();
    last_census_ = now;
  }
  ctx_.c.io_inflight = static_cast<uint64_t>(ram_.reads_in_flight());
  std::lock_guard<std::mutex> lock(snapshot_mu_);
  snapshot_ = ctx_.c;
}

void ResidencyDaemon::CheckInvariants() const {
  ram_.CheckInvariants();
  vram_.CheckInvariants();
  const uint32_t n = ctx_.n_layer * ctx_.n_expert;
  for (uint32_t i = 0; i < n; ++i) {
    CHECK_MSG(ram_.copying(i) == (vram_.state(i) == VramState::kFilling),
              "a RAM slot is held for a copy into VRAM that is not in flight, or the reverse");
  }
}

void ResidencyDaemon::HandleDemand(const shm::DemandRequest& d, int64_t now_ns) {
  ++ctx_.c.lookups;
  if (!ctx_.ep.table().Contains(d.layer, d.expert)) return;  // hostile input: dropped
  if (d.pool == static_cast<uint8_t>(shm::Pool::kVram)) {
    vram_.HandleDemand(d, now_ns);
  } else if (d.pool == static_cast<uint8_t>(shm::Pool::kRam)) {
    ram_.HandleDemand(d, now_ns);
  } else {
    ctx_.Complete(d, shm::kNoSlot, 0, absl::StatusCode::kInvalidArgument);  // hostile input
  }
}

void ResidencyDaemon::HandleHints() {
  shm::Hint hints[16];
  const size_t n = ctx_.ep.hints().PopBatch(absl::MakeSpan(hints));
  ctx_.c.hints += n;
  const bool vram = vram_.open() && options_.vram_prefetch;
  if (!options_.prefetch && !vram) return;
  if (n > 0 && options_.prefetch) ram_.SyncComputeHits();
  const uint32_t n_layer = ctx_.n_layer, n_expert = ctx_.n_expert;
  std::vector<int32_t> experts;
  std::vector<uint8_t> seen(n_expert, 0);
  for (size_t h = 0; h < n; ++h) {
    const shm::Hint& hint = hints[h];
    if (hint.layer >= n_layer) continue;
    // Untrusted: distinct ids in range only.
    experts.clear();
    const int count = std::min<int>(hint.count, 16);
    for (int j = 0; j < count; ++j) {
      const uint32_t e = hint.experts[j];
      if (e < n_expert && !seen[e]) {
        seen[e] = 1;
        experts.push_back(static_cast<int32_t>(e));
      }
    }
    for (int32_t e : experts) seen[e] = 0;
    const bool demand_waiting = ctx_.DemandWaiting();
    if (hint.kind == 1) {  // predicted by compute
      if (demand_waiting) continue;
      const int vram_min = static_cast<int>(options_.vram_prefetch_threshold * 255.0 + 0.5);
      for (int j = 0; j < count; ++j) {
        const uint32_t e = hint.experts[j];
        if (e >= n_expert) continue;
        if (options_.prefetch) ram_.Prefetch(hint.layer, e);
        if (vram && hint.confidence[j] >= vram_min) vram_.Prefetch(hint.layer, e);
      }
      continue;
    }
    if (predictor_ == nullptr) continue;
    predictor_->Observe(static_cast<int>(hint.layer), experts);
    last_hint_layer_ = static_cast<int>(hint.layer);
    if (demand_waiting) continue;
    for (int ahead = 1; ahead <= options_.prefetch_lookahead_layers; ++ahead) {
      const int next = (last_hint_layer_ + ahead) % static_cast<int>(n_layer);
      predictor_->Predict(next, options_.prefetch_threshold, options_.prefetch_max_per_hint, &predictions_);
      for (const ExpertPrediction& p : predictions_) {
        ram_.Prefetch(next, static_cast<uint32_t>(p.expert));
        if (vram && ahead == 1 && p.confidence >= options_.vram_prefetch_threshold)
          vram_.Prefetch(next, static_cast<uint32_t>(p.expert));
      }
    }
  }
}

absl::StatusOr<bool> ResidencyDaemon::Turn() {
  ResidencyCounters& c = ctx_.c;
  bool progress = false;
  const uint64_t sent_before = c.completions_sent;
  const uint64_t vram_before = c.vram_uploads + c.vram_arena_imports + c.vram_arena_refusals;
  // 0. An arena exported (or gone) since the last turn.
  vram_.PollArena();
  // 1. Demand first.
  shm::DemandRequest buf[64];
  for (int rounds = 0; rounds < 16; ++rounds) {
    const size_t n = ctx_.ep.demand().PopBatch(absl::MakeSpan(buf));
    const int64_t now_ns = n > 0 ? ctx_.clock.NowNanos() : 0;
    for (size_t j = 0; j < n; ++j) HandleDemand(buf[j], now_ns);
    if (n > 0) progress = true;
    if (n < 64) break;
  }
  ctx_.FlushCompletions();
  // 2. Loads for the misses, and uploads of demanded experts that RAM holds.
  if (vram_.StartUploads()) progress = true;
  if (ram_.StartLoads()) progress = true;
  // 3. Finished reads and copies; uploads of what they brought into RAM.
  const uint64_t reads_before = c.reads;
  RETURN_IF_ERROR(ram_.Reap());
  if (c.reads != reads_before) progress = true;
  vram_.PollUploads();
  if (vram_.StartUploads()) progress = true;
  if (c.vram_uploads + c.vram_arena_imports + c.vram_arena_refusals != vram_before) progress = true;
  ctx_.FlushCompletions();
  // 4. Hints, and prefetch while no demand waits.
  const uint64_t hints_before = c.hints;
  HandleHints();
  if (c.hints != hints_before) progress = true;
  // 5. Warming, while no demand waits.
  if (options_.warm && !ctx_.DemandWaiting() && ram_.Warm()) progress = true;
  if (c.completions_sent != sent_before) progress = true;
  if (progress) Publish();
  return progress;
}

absl::Status ResidencyDaemon::Run(const std::atomic<bool>& stop) {
  ctx_.segment->StartHeartbeat(options_.heartbeat_interval);
  const Clock& clock = ctx_.clock;
  absl::Status status;
  while (!stop.load(std::memory_order_relaxed)) {
    loop_turns_.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<bool> progress = Turn();
    if (!progress.ok()) {
      status = progress.status();
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (*progress) last_progress_ = now;
    if (!*progress) {
      // Serving a GPU arena, the loop spins (on one core) while copies are in flight and for a
      // while after the last work: the next layer's demand comes within a millisecond, and a sleep
      // or a futex wake costs it 50-100 us more (the kernel's timer slack, the wake-up); a copy
      // lands within ~100 us. Time, not the clock seam: it is about this process's real latency.
      if (vram_.open() && (vram_.copies_in_flight() > 0 || now - last_progress_ < kHotSpin)) {
        for (int i = 0; i < 64; ++i) CpuRelax();
      } else if (ram_.reads_outstanding() > 0) {
        // A read takes milliseconds: wait for it on the demand ring, so that a demand arriving
        // meanwhile is served at once rather than after the read (the next turn reaps it).
        ctx_.ep.demand().WaitForData(kReadPollInterval);
      } else if (!ctx_.completions_waiting() && !ram_.loads_queued()) {
        ctx_.ep.demand().WaitForData(options_.idle_wait);
      } else {
        absl::SleepFor(absl::Microseconds(50));  // waiting for an unpin or ring space
      }
    }
    if (clock.Now() - last_census_ >= kCensusInterval) Publish();  // pins change while idle too
    if (options_.stats_interval > absl::ZeroDuration() && clock.Now() - last_stats_print_ >= options_.stats_interval) {
      last_stats_print_ = clock.Now();
      std::fprintf(stderr, "mer-residency: %s\n", FormatCounters(ctx_.c).c_str());
    }
  }
  ram_.Drain(absl::Seconds(5));
  vram_.Close();  // copies read our RAM slots
  Publish(/*census=*/true);
  return status;
}

}  // namespace mer::residency
