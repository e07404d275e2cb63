// mer-residency's service loop: serves the experts of an expert store to mer-compute through the
// RAM tier of the shared-memory segment (docs/shm_protocol.md), and fills the VRAM arena that
// mer-compute may export over CUDA IPC (docs/cuda.md, "The arena over CUDA IPC").
//
// One thread (Run) owns everything: the demand and hint consumers, the completion producer, the
// residency table writes, the prefetch predictor, and the two tiers, each with the state of its
// own slots: the RAM tier (ram_tier.h: RAM slots, the replacement policy, the IoEngine's reads)
// and the VRAM tier (vram_tier.h: the arena's slot map and the uploader). Each turn of the loop, in
// this order:
//   0. an arena exported or withdrawn since the last turn is imported or closed;
//   1. demand first, always: pops DemandRequests and hands each to its tier; a resident expert
//      completes at once (a hit), a miss joins or queues a load into RAM, or an upload into VRAM
//      (after a load into RAM if need be);
//   2. starts uploads of demanded experts that RAM holds, then queued loads while fewer than
//      io_inflight_max reads are in flight;
//   3. reaps read completions (CRC checked, refetched, DataLoss), then finished uploads, then the
//      uploads that the new RAM residents allow;
//   4. hints: always consumed (the ring must not fill); with prefetch on, routed hints feed the
//      predictor and its predictions (and the compute's own "predicted" hints) are read ahead, but
//      only while no demand is waiting and fewer than prefetch_inflight_max prefetches are in
//      flight, and only into free or unpinned slots. With an arena open, predicted experts that
//      RAM holds are moved into VRAM likewise while no demand waits (vram_prefetch_*).
// The heartbeat is the segment's own thread (ShmSegment::StartHeartbeat), started by Run.
//
// Counters (residency_counters.h) are kept by the loop thread as plain integers; Snapshot()
// returns a consistent copy from any thread (published after every turn that did something, and
// at least every kCensusInterval with a census of the slot states, where the tiers' bookkeeping is
// also CHECKed if ResidencyOptions::check_invariants). The Prometheus exporter
// (services/residency/metrics/) reads Snapshot() when /metrics is scraped: nothing on the hot path
// knows about it. Times are read from a Clock (common/base/clock.h), so tests can set them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/io/io_engine.h"
#include "common/shm/segment.h"
#include "common/store/expert_store.h"
#include "services/residency/daemon/ram_tier.h"
#include "services/residency/daemon/residency_counters.h"
#include "services/residency/daemon/residency_options.h"
#include "services/residency/daemon/tier_context.h"
#include "services/residency/daemon/vram_tier.h"
#include "services/residency/policy/prefetch_predictor.h"
#include "services/residency/vram/vram_uploader.h"

namespace mer::residency {

// RAM slots for a budget: budget / blob_bytes, at least the floor of ResidencyOptions.
uint32_t RamSlotCount(const ExpertStore& store, const ResidencyOptions& options);
// InvalidArgument unless 1 <= expert_share_ranks and 0 <= expert_share_rank < expert_share_ranks.
absl::Status CheckExpertShare(const ResidencyOptions& options);
// The segment geometry mer-residency creates for `store` (identity from StoreSegmentIdentity).
shm::SegmentGeometry DaemonGeometry(const ExpertStore& store, const ResidencyOptions& options);

class ResidencyDaemon {
 public:
  // `segment` was created by this process (Role::kResidency) with DaemonGeometry's layout, and
  // outlives the daemon; `experts_fd` is the descriptor of experts.bin that `io` reads (the
  // store's own, or a MemIoEngine's in tests). `clock` (the real one unless given) outlives it.
  static absl::StatusOr<std::unique_ptr<ResidencyDaemon>> Create(const ExpertStore& store, shm::ShmSegment* segment,
                                                                 std::unique_ptr<IoEngine> io, int experts_fd,
                                                                 const ResidencyOptions& options,
                                                                 const Clock* clock = RealClock());

  // Serves until `stop` is true (checked at least every idle_wait), then returns OK; an error
  // only if the I/O engine breaks. Reads in flight are drained before it returns.
  absl::Status Run(const std::atomic<bool>& stop);
  // One turn of the loop; returns whether anything happened (for tests that drive it directly).
  absl::StatusOr<bool> Turn();

  ResidencyCounters Snapshot() const;
  // Longest time between slot censuses (and publications) while Run serves.
  static constexpr absl::Duration kCensusInterval = absl::Milliseconds(10);
  // How often Run looks for finished reads while it waits for demand with reads in flight.
  static constexpr absl::Duration kReadPollInterval = absl::Microseconds(50);
  // With a GPU arena open, the loop spins this long after its last work before it sleeps (Run).
  static constexpr std::chrono::microseconds kHotSpin{1000};
  const ResidencyOptions& options() const { return options_; }
  IoEngine& io() { return *io_; }
  uint32_t ram_slots() const { return ram_.slots(); }
  bool exclusive_tiers() const { return ram_.exclusive(); }
  // Turns of Run's loop so far (any thread): the liveness that the systemd watchdog pings
  // follow. The loop turns at least every idle_wait while idle.
  uint64_t loop_turns() const { return loop_turns_.load(std::memory_order_relaxed); }
  // Whether the engine accepted the slot pool as registered buffers.
  bool buffers_registered() const { return buffers_registered_; }
  // How VRAM uploaders are made (default: CreateCudaVramUploader over the RAM tier, which is
  // Unimplemented without CUDA). Call before Run; tests give a fake.
  void set_vram_uploader_factory(VramUploaderFactory factory) { vram_.set_uploader_factory(std::move(factory)); }
  bool vram_arena_open() const { return vram_.open(); }

 private:
  ResidencyDaemon(const ExpertStore& store, shm::ShmSegment* segment, std::unique_ptr<IoEngine> io, int experts_fd,
                  const ResidencyOptions& options, const Clock& clock, std::unique_ptr<ReplacementPolicy> policy,
                  uint64_t max_used_bytes, VramUploaderFactory vram_factory);

  void HandleDemand(const shm::DemandRequest& d, int64_t now_ns);
  void HandleHints();
  // Copies the counters for Snapshot(); with a slot census first when the last one is older than
  // kCensusInterval, or `census`.
  void Publish(bool census = false);
  // CHECKs both tiers' bookkeeping, and the one state they share: a copy into VRAM in flight
  // exactly while the RAM tier holds its source slot for it.
  void CheckInvariants() const;

  const ResidencyOptions options_;
  std::unique_ptr<IoEngine> io_;
  TierContext ctx_;
  RamTier ram_;
  VramTier vram_;
  std::unique_ptr<PrefetchPredictor> predictor_;
  bool buffers_registered_ = false;
  std::atomic<uint64_t> loop_turns_{0};  // loop_turns(): written by the loop, read by any thread
  std::vector<ExpertPrediction> predictions_;
  int last_hint_layer_ = -1;

  mutable std::mutex snapshot_mu_;
  ResidencyCounters snapshot_;
  absl::Time last_stats_print_;
  absl::Time last_census_ = absl::InfinitePast();
  std::chrono::steady_clock::time_point last_progress_;  // Run's last turn that did work
};

}  // namespace mer::residency
