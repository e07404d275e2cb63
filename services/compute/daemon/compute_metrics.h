// mer-compute's Prometheus metrics (docs/metrics.md): step latency and batch size histograms,
// token and sequence counters (updated by the Batcher's step thread), and the capacity gauges
// (slots, KV budget) read from a callback at scrape time.
//
// Thread-safety: every method may be called from any thread (prometheus-cpp's metrics are
// thread-safe); the capacity callback is called on the exposer's threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace prometheus {
class Collectable;
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace mer::compute {

struct Capacity {
  int max_sequences = 0;
  int free_sequences = 0;
  int64_t kv_budget_tokens = 0;
  int64_t kv_free_tokens = 0;
};

// The cuda backend's own counters (cumulative since it was created) and VRAM use, bytes.
struct BackendStats {
  int64_t expert_lookups = 0;  // distinct (layer, expert) a batch needed, summed over layers
  int64_t expert_misses = 0;   // of those, not in the VRAM arena (uploaded)
  int64_t upload_bytes = 0;    // host -> VRAM expert uploads
  int64_t evictions = 0;       // arena slots reused for another expert
  int64_t host_syncs = 0;      // synchronisations inside the forward pass
  int64_t graph_launches = 0;  // steps replayed as a CUDA graph
  int64_t tokens = 0;          // batch tokens processed
  int64_t prefetch_issued = 0, prefetch_useful = 0, prefetch_wasted = 0;  // look-ahead into VRAM
  int64_t arena_slots = 0, arena_resident = 0;
  // The arena is filled by mer-residency (CUDA IPC): its page has the VRAM slots by state, so this
  // page drops its mer_tier_slots{tier="vram"} (which would read 0 resident).
  bool arena_placed_by_residency = false;
  int64_t dense_bytes = 0, kv_bytes = 0, workspace_bytes = 0, arena_bytes = 0;
  int64_t vram_used_bytes = 0;       // device-wide, when sampled
  int64_t vram_used_peak_bytes = 0;  // the highest sampled
};

class ComputeMetrics {
 public:
  // `backend` labels mer_build_info; `capacity` (may be empty) is read at every scrape.
  ComputeMetrics(const std::string& version, const std::string& backend,
                 std::function<Capacity()> capacity);
  ~ComputeMetrics();

  // One step: its duration, tokens in the batch, sequences running, prompt tokens fed and tokens
  // generated (logits rows sampled).
  void OnStep(double seconds, int batch_tokens, int sequences, int prompt_tokens, int generated);
  // A sequence left the batch (OK, cancelled or failed) after generating `generated` tokens.
  void OnSequenceEnd(const absl::Status& status, int generated);
  // A sample of the backend's counters (the cuda backend's; families exist only for it): the
  // counters advance by the difference to the previous sample. Called by the thread that runs
  // the forward pass (BatcherOptions::after_step), the only one that may read them.
  void OnBackendStats(const BackendStats& stats);

  void set_capacity(std::function<Capacity()> capacity);

  // The registry and the capacity gauges, for MetricsEndpoint.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mer::compute
