// mer-residency's service loop: serves the experts of an expert store to mer-compute through the
// RAM tier of the shared-memory segment (docs/shm_protocol.md), and fills the VRAM arena that
// mer-compute may export over CUDA IPC (docs/cuda.md, "The arena over CUDA IPC").
//
// One thread (Run) owns everything: the demand and hint consumers, the completion producer, the
// residency table writes, the replacement policy, the prefetch predictor, the IoEngine and the
// VRAM tier (the slot map and the uploader). Each turn of the loop, in this order:
//   0. an arena exported or withdrawn since the last turn is imported or closed;
//   1. demand first, always: pops DemandRequests; a RAM-resident expert completes at once (a hit);
//      a miss joins the load of that expert already in flight, if any (duplicate demands are
//      coalesced: one read, one completion per request), or queues a new load. A VRAM demand
//      completes at once if the expert is in VRAM, else waits for an upload (after a load into
//      RAM if need be);
//   2. starts uploads of demanded experts that RAM holds, then queued loads while fewer than
//      io_inflight_max reads are in flight: a RAM slot that no step can read (a free one, or the
//      policy's victim among the unpinned residents, evicted with the R1-R3 protocol of
//      common/shm/residency_table.h), then one read of blob_bytes() at BlobOffset into the slot
//      (O_DIRECT where the store allows it; the pool is registered with the engine as fixed
//      buffers where the engine can);
//   3. reaps read completions: the blob's CRC is checked (ExpertStore::VerifyBlob); a mismatch is
//      counted and the blob read again up to max_refetches times, after which the waiters get
//      DataLoss naming the expert and the entry is marked failed: corrupted bytes are never
//      published. A good blob is published (PublishResident) and its Completions pushed; then
//      finished uploads (an upload is published only once its copy has completed) and the
//      uploads that the new RAM residents allow;
//   4. hints: always consumed (the ring must not fill); with prefetch on, routed hints feed the
//      predictor and its predictions (and the compute's own "predicted" hints) are read ahead, but
//      only while no demand is waiting and fewer than prefetch_inflight_max prefetches are in
//      flight, and only into free or unpinned slots. With an arena open, predicted experts that
//      RAM holds are moved into VRAM likewise while no demand waits (vram_prefetch_*).
// The heartbeat is the segment's own thread (ShmSegment::StartHeartbeat), started by Run.
//
// Counters (ResidencyCounters) are kept by the loop thread as plain integers; Snapshot() returns a
// consistent copy from any thread (published after every turn that did something, and at least
// every kCensusInterval with a census of the slot states). The Prometheus exporter
// (services/residency/metrics/) reads Snapshot() when /metrics is scraped: nothing on the hot path
// knows about it. ForEachCounter lists the scalar counters for printing.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shm/client.h"
#include "common/shm/segment.h"
#include "common/store/expert_store.h"
#include "common/shm/store_identity.h"
#include "services/residency/io/io_engine.h"
#include "services/residency/policy/prefetch_predictor.h"
#include "services/residency/policy/replacement_policy.h"
#include "services/residency/vram/vram_slot_map.h"
#include "services/residency/vram/vram_uploader.h"

namespace mer::residency {

struct ResidencyOptions {
  // RAM tier size: the slot count is ram_budget_bytes / blob_bytes, at least min_ram_slots.
  uint64_t ram_budget_bytes = uint64_t{1} << 30;
  // Floor on the RAM slot count (and 1 is the floor of the floor). The engine acquires a layer's
  // experts in groups of at most half the slots, so any count serves any batch.
  uint32_t min_ram_slots = 0;
  // Replacement policy of the RAM tier: "lru", "lfu" or "arc".
  std::string policy = "lru";
  // Blob reads in flight at once (demand and prefetch together); also the IoEngine queue depth.
  int io_inflight_max = 16;
  // Read ahead from hints (predictor + predicted hints).
  bool prefetch = false;
  // Prefetch reads in flight at once (a part of io_inflight_max).
  int prefetch_inflight_max = 2;
  // Warm the RAM tier: while no demand waits, read the store's experts (layer by layer) into free
  // RAM slots until none is left, io_inflight_max - 2 reads at a time, so that the first requests
  // do not wait for the disk. Only free slots: warming evicts nothing.
  bool warm = false;
  // Predictions below this confidence (0..1) are not prefetched.
  double prefetch_threshold = 0.5;
  // Most experts prefetched per hint.
  int prefetch_max_per_hint = 4;
  // How many layers past the hinted one to predict and prefetch. 1 is the next layer only; a
  // layer computes in about the time one blob read takes, so a read for the very next layer is
  // mostly late, and looking further ahead gives reads time to land.
  int prefetch_lookahead_layers = 2;
  // Reads of a blob again after a checksum mismatch or a read error before failing the load.
  int max_refetches = 2;
  // Heartbeat period of the residency role.
  absl::Duration heartbeat_interval = absl::Milliseconds(100);
  // Longest sleep of the idle loop (demand ring futex, or the engine's Wait) before re-checking.
  absl::Duration idle_wait = absl::Milliseconds(2);
  // Print the counters to stderr this often from Run; zero = never.
  absl::Duration stats_interval = absl::ZeroDuration();
  // VRAM tier (the arena compute exports through CUDA IPC; docs/cuda.md). RAM -> VRAM copies in
  // flight at once, demand and prefetch together.
  int vram_upload_inflight_max = 4;
  // Move predicted experts (compute's predicted hints, and the predictor's when prefetch is on)
  // from RAM into free or least recently used unpinned VRAM slots while no demand waits.
  bool vram_prefetch = true;
  // Of vram_upload_inflight_max, at most this many copies are prefetches (demand keeps the rest).
  int vram_prefetch_inflight_max = 1;
  // Predictions below this confidence (0..1) are not moved into VRAM.
  double vram_prefetch_threshold = 0.5;
};

// Upper bounds (seconds) of the read latency histogram's buckets; one more bucket (+Inf) follows.
inline constexpr std::array<double, 14> kReadLatencyBucketsSeconds = {
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
    0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1.0};

// Everything the daemon counts since it started (times in microseconds unless the name says
// otherwise), and a few gauges of its state at the last publication.
struct ResidencyCounters {
  uint64_t lookups = 0;            // DemandRequests handled
  uint64_t hits = 0;               // of those, resident in RAM already
  uint64_t misses = 0;             // of those, not resident (a load started or joined)
  uint64_t compute_hits = 0;       // acquisitions compute found resident and pinned without a
                                   // demand (read from the table's hit counts, every census)
  uint64_t coalesced = 0;          // misses that joined a load already in flight
  uint64_t loads = 0;              // blobs published resident
  uint64_t load_failures = 0;      // loads failed for good (DataLoss or an I/O error)
  uint64_t reads = 0;              // blob reads completed (refetches included)
  uint64_t bytes_read = 0;         // bytes of those reads
  uint64_t read_errors = 0;        // reads the engine failed
  uint64_t checksum_failures = 0;  // blobs whose CRC did not match
  uint64_t refetches = 0;          // reads issued again after a failure
  uint64_t evictions = 0;          // residents removed to free a slot
  uint64_t slot_waits = 0;         // times a load waited for an unpinned slot
  uint64_t hints = 0;              // hints consumed
  uint64_t prefetch_issued = 0;    // prefetch reads started
  uint64_t warm_loads = 0;         // reads started to warm the RAM tier (ResidencyOptions::warm)
  uint64_t prefetch_useful = 0;    // prefetched experts used (demanded, or hit by compute) before eviction
  uint64_t prefetch_wasted = 0;    // prefetched experts evicted (or failed) unused
  uint64_t read_latency_us_total = 0;  // sum over reads, submit to completion
  uint64_t read_latency_us_max = 0;
  uint64_t completions_sent = 0;
  // Sum over completions of demands that missed: demand popped -> its Completion pushed (ns).
  uint64_t stall_ns_total = 0;
  uint64_t stalled_completions = 0;  // completions counted in stall_ns_total
  // Read latency histogram: reads per bucket (not cumulative), bounds kReadLatencyBucketsSeconds,
  // the last one above all bounds.
  std::array<uint64_t, kReadLatencyBucketsSeconds.size() + 1> read_latency_buckets{};
  double read_latency_seconds_total = 0;  // the histogram's sum, at full resolution
  // Gauges: reads in flight, and the RAM slots by state (from the last census; they sum to the
  // slot count): pinned = a compute step holds it; loading = a read into it is in flight;
  // resident = holds a published expert, unpinned; free = no owner, unpinned.
  uint64_t io_inflight = 0;
  uint64_t slots_free = 0;
  uint64_t slots_resident = 0;
  uint64_t slots_pinned = 0;
  uint64_t slots_loading = 0;
  // VRAM tier (zero until compute exports an arena).
  uint64_t vram_arena_imports = 0;   // arenas imported
  uint64_t vram_arena_refusals = 0;  // exports refused (no CUDA, a bad export, an import error)
  uint64_t vram_lookups = 0;         // VRAM DemandRequests handled
  uint64_t vram_hits = 0;            // of those, in VRAM already
  uint64_t vram_misses = 0;          // of those, an upload started or joined
  uint64_t vram_refused = 0;         // of those, answered with an error (no arena)
  // Demanded VRAM fills by where the bytes were: in the RAM tier already, or read from the store
  // first (the RAM tier's misses on the served GPU path; mer_expert_misses_total{tier="ram"}).
  uint64_t vram_fills_from_ram = 0;
  uint64_t vram_fills_from_store = 0;
  uint64_t vram_uploads = 0;         // RAM -> VRAM copies completed and published
  uint64_t vram_upload_bytes = 0;    // bytes of those copies
  uint64_t vram_evictions = 0;       // VRAM residents unpublished to free a slot
  uint64_t vram_slot_waits = 0;      // times an upload waited for an unpinned VRAM slot
  uint64_t vram_prefetch_issued = 0; // uploads started for a prediction
  uint64_t vram_prefetch_useful = 0; // of those, demanded or pinned by compute before eviction
  uint64_t vram_prefetch_wasted = 0; // of those, evicted (or dropped) unused
  // Gauges: the arena's slots by state (they sum to vram_slots): pinned by a compute step,
  // filling (a copy in flight), resident (published, unpinned), free.
  uint64_t vram_slots = 0;
  uint64_t vram_slots_free = 0;
  uint64_t vram_slots_resident = 0;
  uint64_t vram_slots_pinned = 0;
  uint64_t vram_slots_filling = 0;
};

// Calls fn(name, value) for every counter (names in snake_case; for exporters and printing).
void ForEachCounter(const ResidencyCounters& c,
                    const std::function<void(const char* name, uint64_t value)>& fn);
// "lookups=… hits=… …" on one line.
std::string FormatCounters(const ResidencyCounters& c);

// RAM slots for a budget: budget / blob_bytes, at least the floor of ResidencyOptions.
uint32_t RamSlotCount(const ExpertStore& store, const ResidencyOptions& options);
// The segment geometry mer-residency creates for `store` (identity from StoreSegmentIdentity).
shm::SegmentGeometry DaemonGeometry(const ExpertStore& store, const ResidencyOptions& options);

class ResidencyDaemon {
 public:
  // `segment` was created by this process (Role::kResidency) with DaemonGeometry's layout, and
  // outlives the daemon; `experts_fd` is the descriptor of experts.bin that `io` reads (the
  // store's own, or a MemIoEngine's in tests).
  static absl::StatusOr<std::unique_ptr<ResidencyDaemon>> Create(const ExpertStore& store,
                                                                 shm::ShmSegment* segment,
                                                                 std::unique_ptr<IoEngine> io,
                                                                 int experts_fd,
                                                                 const ResidencyOptions& options);
  ~ResidencyDaemon();

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
  const ResidencyOptions& options() const { return options_; }
  IoEngine& io() { return *io_; }
  uint32_t ram_slots() const { return n_slots_; }
  // Turns of Run's loop so far (any thread): the liveness that the systemd watchdog pings
  // follow. The loop turns at least every idle_wait while idle.
  uint64_t loop_turns() const { return loop_turns_.load(std::memory_order_relaxed); }
  // Whether the engine accepted the slot pool as registered buffers.
  bool buffers_registered() const { return buffers_registered_; }
  // How VRAM uploaders are made (default: CreateCudaVramUploader over the RAM tier, which is
  // Unimplemented without CUDA). Call before Run; tests give a fake.
  void set_vram_uploader_factory(VramUploaderFactory factory) { vram_factory_ = std::move(factory); }
  bool vram_arena_open() const { return vram_open_; }

 private:
  struct Expert {
    uint32_t slot = shm::kNoSlot;  // RAM slot while resident or loading
    bool loading = false;
    bool prefetched = false;       // admitted by a prefetch, not demanded since
    bool prefetch_load = false;    // the load in flight is a prefetch
    uint64_t hits_seen = 0;        // the entry's compute-side hit count the policy has been told of
    int attempts = 0;
    bool load_queued = false;      // in queued_, waiting for a RAM slot or a read
    std::vector<shm::DemandRequest> waiters;
    std::vector<int64_t> waiter_arrival_ns;  // per waiter: when its demand was popped
    // VRAM tier.
    uint32_t vram_slot = shm::kNoSlot;  // while resident or filling
    bool vram_filling = false;     // a copy from its RAM slot is in flight (the RAM slot stays)
    bool vram_queued = false;      // in vram_queue_, waiting for its RAM copy or a VRAM slot
    bool vram_prefetched = false;  // filled by a prediction, not used since
    bool vram_prefetch_load = false;  // the copy in flight is a prefetch
    uint64_t vram_fill = 0;        // the published fill number (ResidencyEntry::vram_fill)
    uint64_t vram_fill_epoch = 0;  // compute_epoch when the fill was published
    std::vector<shm::DemandRequest> vram_waiters;
    std::vector<int64_t> vram_waiter_arrival_ns;
  };

  ResidencyDaemon(const ExpertStore& store, shm::ShmSegment* segment, std::unique_ptr<IoEngine> io,
                  int experts_fd, const ResidencyOptions& options);

  uint32_t Index(uint32_t layer, uint32_t expert) const { return layer * n_expert_ + expert; }
  void HandleDemand(const shm::DemandRequest& d, int64_t now_ns);
  bool StartLoads();
  void Prefetch(uint32_t layer, uint32_t expert);
  // Starts the read of expert `index` into `slot` ahead of any demand: a guess (a prefetch, whose
  // use is counted) or warming.
  void StartLoadAhead(uint32_t index, uint32_t slot, bool guess);
  // Starts warming reads into free slots (ResidencyOptions::warm); returns whether it started any.
  bool WarmRam();
  // Logs what warming read, once it has finished.
  void ReportWarmed();
  std::optional<uint32_t> AllocateSlot(ExpertKey incoming, bool for_prefetch);
  absl::Status Submit(uint32_t index);
  absl::Status Reap();
  void FinishLoad(uint32_t index, const absl::Status& status);
  void Complete(const shm::DemandRequest& d, uint32_t slot, uint64_t generation,
                absl::StatusCode code, int64_t arrival_ns = 0, shm::Pool pool = shm::Pool::kRam);
  // Writes (layer, expert)'s entry from the loop's own state: its RAM slot unless loading, its
  // VRAM slot unless filling. Returns the generation.
  uint64_t PublishEntry(uint32_t index);
  // VRAM tier.
  void PollVramArena();
  void DropVramArena(const char* why);
  void HandleVramDemand(const shm::DemandRequest& d, int64_t now_ns);
  std::optional<uint32_t> AllocateVramSlot(uint64_t used_before);
  // Starts the copy of expert `index` (RAM-resident) into a VRAM slot; false if no slot is free.
  bool StartVramUpload(uint32_t index, bool prefetch);
  bool StartVramUploads();
  void PollVramUploads();
  void FailVramWaiters(uint32_t index, absl::StatusCode code);
  void VramPrefetch(uint32_t layer, uint32_t expert);
  bool DemandWaiting();
  // Whether compute has pinned the prefetched expert's slot since its fill (a use it made without
  // asking); counts it useful once.
  bool VramPrefetchUsed(uint32_t index);
  void CensusVramSlots();
  void HandleHints();
  // Compute pins resident experts without asking (a hit costs it no round trip), so the policy
  // learns of those uses from the table: every resident whose hit count grew is touched, oldest
  // use first, before the policy is asked for a victim. A prefetched expert hit since its load
  // counts as a useful prefetch here.
  void SyncComputeHits();
  // The hits compute made on expert `index` since the last call (from the table's count), added
  // to compute_hits. A prefetched expert with new hits was a useful prefetch.
  uint64_t TakeComputeHits(uint32_t index);
  void FlushCompletions();
  // Copies the counters for Snapshot(); with a slot census first when the last one is older than
  // kCensusInterval, or `census`.
  void Publish(bool census = false);
  void CensusSlots();

  const ExpertStore& store_;
  shm::ShmSegment* segment_;
  std::unique_ptr<IoEngine> io_;
  const int fd_;
  const ResidencyOptions options_;
  const uint32_t n_layer_, n_expert_, n_slots_;
  shm::ResidencyEndpoint ep_;
  std::unique_ptr<ReplacementPolicy> policy_;
  std::unique_ptr<PrefetchPredictor> predictor_;
  bool buffers_registered_ = false;

  std::vector<Expert> experts_;          // [n_layer * n_expert]
  std::vector<uint32_t> slot_owner_;     // per slot: expert index, or kFreeOwner
  struct TouchedExpert {
    uint64_t epoch;    // its last use by compute
    uint32_t index;    // expert index
    uint64_t touches;  // hits since the last sync, capped
  };
  static constexpr uint64_t kMaxTouchesPerSync = 64;  // bounds the work a hostile count can cause
  std::vector<TouchedExpert> touched_;    // SyncComputeHits' scratch, reserved for every slot
  std::atomic<uint64_t> loop_turns_{0};   // loop_turns(): written by the loop, read by any thread
  std::vector<uint32_t> free_slots_;     // slots without owner (maybe still pinned: R3)
  std::deque<uint32_t> queued_;          // expert indices waiting for a slot / a read
  std::vector<absl::Time> submit_time_;  // per expert index, of the read in flight
  int inflight_ = 0, prefetch_inflight_ = 0;
  // Warming: the next expert index to look at, and when it started (for the log line at its end).
  uint32_t warm_next_ = 0;
  absl::Time warm_start_;
  uint64_t warm_bytes_start_ = 0;
  bool warm_reported_ = false;
  std::deque<shm::Completion> out_;
  std::deque<int64_t> out_arrival_ns_;   // parallel to out_: demand pop time of a miss, or 0
  std::vector<ReadCompletion> reaped_;
  std::vector<ExpertPrediction> predictions_;
  int last_hint_layer_ = -1;

  // VRAM tier: the arena compute exported, once imported.
  VramUploaderFactory vram_factory_;
  std::unique_ptr<VramUploader> uploader_;
  bool vram_open_ = false;
  uint64_t vram_incarnation_ = 0;    // the compute incarnation whose arena is open
  uint64_t vram_acted_sequence_ = 0; // the last export acted on
  uint64_t vram_acted_incarnation_ = 0;
  absl::StatusCode vram_refusal_ = absl::StatusCode::kFailedPrecondition;  // for demands without arena
  VramSlotMap vram_map_;
  uint64_t vram_fill_counter_ = 0;
  uint64_t max_used_bytes_ = 0;       // the largest expert payload (what one upload copies)
  std::deque<uint32_t> vram_queue_;   // demanded experts waiting for an upload
  int vram_prefetch_inflight_ = 0;
  std::vector<uint64_t> vram_done_;

  ResidencyCounters c_;
  mutable std::mutex snapshot_mu_;
  ResidencyCounters snapshot_;
  absl::Time last_stats_print_;
  absl::Time last_census_ = absl::InfinitePast();
};

}  // namespace mer::residency
