// mer-compute's Prometheus metrics (docs/metrics.md): step latency and batch size histograms,
// token and sequence counters (updated by the Batcher's step thread), the capacity gauges
// (slots, KV budget) read from a callback at scrape time, and the backend's counters
// (OnBackendCounters; their families exist only for a backend with a device).
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
#include "services/compute/backend.h"

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

class ComputeMetrics {
 public:
  // `backend` labels mer_build_info; `capacity` (may be empty) is read at every scrape.
  ComputeMetrics(const std::string& version, const std::string& backend, std::function<Capacity()> capacity);
  ~ComputeMetrics();

  // One step: its duration, tokens in the batch, sequences running, prompt tokens fed and tokens
  // generated (logits rows sampled).
  void OnStep(double seconds, int batch_tokens, int sequences, int prompt_tokens, int generated);
  // A sequence left the batch (OK, cancelled or failed) after generating `generated` tokens.
  void OnSequenceEnd(const absl::Status& status, int generated);
  // A sample of the backend's counters, and of each expert-parallel rank's (ComputeBackend::
  // rank_counters; empty for one engine): the counters advance by the difference to the previous
  // sample. The expert pairs are counted for every backend (by rank with ranks, which also count
  // their exchange time); the other families exist only for a backend with a device, the cuda
  // one. Called by the thread that runs the forward pass (BatcherOptions::after_step), the only
  // one that may read them; the ranks' count must not change between calls.
  void OnBackendCounters(const BackendCounters& counters, const std::vector<BackendCounters>& ranks = {});

  void set_capacity(std::function<Capacity()> capacity);

  // The registry and the capacity gauges, for MetricsEndpoint.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mer::compute
