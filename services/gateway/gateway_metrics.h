// mer-gateway's Prometheus metrics (docs/metrics.md): requests by final status, running and
// waiting requests, KV-cache usage, queue time, time to first token, inter-token latency, request
// duration, prompt and generated tokens, finished requests by finish reason -- the series a vLLM
// dashboard reads, under mer's names, the per-request ones labelled with model_name.
// collectables() also scrapes mer-compute's and mer-residency's
// /metrics (when their URLs are set) and merges everything into one page (metrics_merge.h), with
// mer_scrape_up{daemon} telling whether each scrape worked.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace mer::gateway {

struct GatewayMetricsOptions {
  std::string version;
  std::string model_name;           // the model_name label until SetModelName
  std::string compute_metrics_url;  // empty: not scraped
  // One per mer-residency instance (one per expert-parallel rank of mer-compute, rank r's the
  // r-th); with several, each page's series are labelled rank="r". Empty: none scraped.
  std::vector<std::string> residency_metrics_urls;
  absl::Duration scrape_timeout = absl::Seconds(2);
};

class GatewayMetrics {
 public:
  explicit GatewayMetrics(const GatewayMetricsOptions& options);
  ~GatewayMetrics();

  // A Generate call ended with `code`.
  void OnRequestEnd(grpc::StatusCode code);
  // Read at every scrape: (running, waiting) requests.
  void SetLoadCallback(std::function<std::pair<int, int>()> load);
  // Read at every scrape: the fraction of the KV budget that running requests reserve.
  void SetKvUsageCallback(std::function<double()> usage);
  // The model_name label of the per-request series from now on (the served model's id).
  void SetModelName(const std::string& name);
  // A request ended with a final message: "stop" (a stop token or sequence), "length" or
  // "abort" (the server cancelled it).
  void OnFinish(const std::string& finish_reason);
  void SetComputeUp(bool up);
  void ObserveQueue(double seconds);
  void ObserveTtft(double seconds);
  void ObserveInterToken(double seconds);
  void ObserveDuration(double seconds);
  void AddPromptTokens(int n);
  void AddGeneratedTokens(int n);

  // The combined page (for MetricsEndpoint).
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace mer::gateway
