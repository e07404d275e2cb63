// The host side of misses decided on the device (docs/cuda.md, "Misses decided on the device"):
// a thread of mer-compute that reads the routing records the device posts for every layer of a
// step (routing_record.h), and for a layer whose experts are not all in the arena has
// mer-residency place them (ResidencyVram::Place: demand, upload, long-lived pins), converts the
// fresh fills, uploads the changed slot-table rows and opens the layer's gate, all on its own
// stream, in that order. The step's stream waits on the gate on the device; the thread that runs
// the steps never waits for a layer. Every record also feeds the retirement order (the experts a
// step used) and mer-residency's hints (routed and, on decode steps, the look-ahead's predicted).
//
// Slots: every expert the table publishes is pinned (PublishedExperts says why that is safe and
// when retiring is). Before it has a layer's misses placed, the service retires the least recently
// used published experts until reserve_slots slots beyond the misses are unpinned, so that
// mer-residency always has somewhere to put them.
//
// A failed placement (DataLoss for a corrupt expert, Unavailable with no mer-residency) still
// opens the gate, with the missing experts pointed at the poison slot (zeros): the step completes,
// and the engine returns the error for it (TakeError) before the next step runs.
//
// Thread-safety: Create, the destructor, StepLaunched/StepDone and TakeError are for the engine's
// stepping thread; the rest runs on the service's own thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/compute/cuda/published_experts.h"
#include "services/compute/cuda/residency_vram.h"
#include "services/compute/cuda/routing_record.h"

struct CUstream_st;

namespace mer::cuda {

struct VramMissServiceOptions {
  int n_layer = 0, n_expert = 0, k = 0;
  int32_t n_slots = 0;       // the exported arena's slots
  int32_t poison_slot = -1;  // a zeroed slot past the exported ones
  // Unpinned slots kept beyond a layer's misses (mer-residency's VRAM prefetches land there).
  int reserve_slots = 0;
  int device = 0;
  bool debug = false;                      // log every layer it serves (MER_CUDA_DEBUG)
  ArenaPolicy policy = ArenaPolicy::kLfu;  // the retirement order
};

struct VramMissServiceStats {
  uint64_t records = 0;                 // routing records read
  uint64_t layers_served = 0;           // records with misses, served
  uint64_t placed = 0;                  // experts placed for misses (pinned and published)
  uint64_t demanded = 0;                // of those, not in VRAM when asked (mer-residency uploaded them)
  uint64_t retired = 0;                 // published experts unpinned to make room
  uint64_t failures = 0;                // layers whose placement failed (the step returned an error)
  uint64_t skipped = 0, malformed = 0;  // records lost to a lap, or rejected as invalid
  uint64_t serve_us = 0;                // wall time from reading a miss record to opening its gate
};

class VramMissService {
 public:
  // ring: the host-mapped record ring (capacity records of record_bytes); slot_table: the device
  // table (int32 [n_layer, n_expert]); gates: the device gates (uint32 [n_layer]). Starts the
  // thread. `residency` outlives the service.
  static absl::StatusOr<std::unique_ptr<VramMissService>> Create(ResidencyVram& residency,
                                                                 const VramMissServiceOptions& options,
                                                                 const uint8_t* ring, int32_t capacity,
                                                                 int32_t record_bytes, int32_t* slot_table,
                                                                 uint32_t* gates);
  ~VramMissService();

  // The stepping thread, before a step's launch and once its completion has been seen: while a
  // step is in flight the service polls the ring without sleeping.
  void StepLaunched() {
    // The watchdog's clock starts with the first step in flight, not at an idle spell's start.
    if (inflight_.fetch_add(1, std::memory_order_relaxed) == 0)
      last_record_ns_.store(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
              .count(),
          std::memory_order_relaxed);
  }
  void StepDone() { inflight_.fetch_sub(1, std::memory_order_relaxed); }
  // Routing records read so far (one per layer of every step the device ran, in order): how far
  // the device has come. WaitForRecords polls until at least n have been read, outside the driver.
  uint64_t records_read() const { return position_.load(std::memory_order_acquire); }
  void WaitForRecords(uint64_t n) const;
  // After a step completed: OK, or the error of a layer whose placement failed since the last
  // call, after the poisoned table entries were reset (so the next step misses them again).
  absl::Status TakeError();
  bool HasError() const { return has_error_.load(); }

  VramMissServiceStats stats() const;

 private:
  VramMissService(ResidencyVram& residency, const VramMissServiceOptions& options, const uint8_t* ring,
                  int32_t capacity, int32_t record_bytes, int32_t* slot_table, uint32_t* gates);
  void Loop();
  // Says on stderr when a step in flight makes no progress: no routing record for seconds, or
  // one layer's placement taking seconds (with what it waits for).
  void Watchdog();
  void Serve(const RoutingRecord& r);
  // Enqueues the upload of row `layer` of the host table to the device table on stream_.
  void UploadRow(int layer);

  ResidencyVram& residency_;
  const VramMissServiceOptions o_;
  RoutingRecordReader reader_;
  int32_t* const slot_table_;
  uint32_t* const gates_;
  CUstream_st* stream_ = nullptr;
  int32_t* host_table_ = nullptr;  // pinned mirror of the published table, what rows upload from

  std::mutex mu_;  // held while a record is served and while TakeError resets
  PublishedExperts published_;
  uint64_t attachment_ = 0;
  std::vector<int64_t> poisoned_;  // keys pointed at the poison slot by a failed placement
  absl::Status error_;             // the first failure not yet taken
  std::atomic<bool> has_error_{false};
  std::vector<int32_t> missing_, placed_rows_, place_row_;
  std::vector<int64_t> retirees_;
  std::vector<uint8_t> confidence_;

  std::atomic<int> inflight_{0};
  std::atomic<bool> stop_{false};
  // For the watchdog: when the last record was read, and the layer being served since when (0:
  // none), in steady-clock nanoseconds.
  std::atomic<int64_t> last_record_ns_{0}, serving_since_ns_{0};
  std::atomic<int> serving_layer_{-1}, serving_missing_{0};
  std::atomic<uint32_t> serving_step_{0};
  std::atomic<uint64_t> position_{0};
  mutable std::mutex stats_mu_;
  VramMissServiceStats stats_;
  std::thread thread_, watchdog_;
};

}  // namespace mer::cuda
