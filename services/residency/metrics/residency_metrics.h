// mer-residency's Prometheus metrics (docs/metrics.md): the metric families of a ResidencyCounters
// snapshot, and a /metrics HTTP endpoint (a MetricsEndpoint) that builds them on every scrape
// from a snapshot callback. Collection is pull-time only: the daemon's loop thread keeps
// plain counters and publishes a snapshot (ResidencyDaemon::Snapshot); nothing here runs on it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics/metrics_endpoint.h"
#include "prometheus/metric_family.h"
#include "services/residency/daemon/residency_counters.h"

namespace mer::residency {

// The version mer_build_info reports (the CMake project version).
const char* MerVersion();

// The families of docs/metrics.md for one snapshot.
std::vector<prometheus::MetricFamily> ResidencyMetricFamilies(const ResidencyCounters& c, const std::string& version);
// The same in the Prometheus text exposition format (what /metrics serves).
std::string RenderResidencyMetrics(const ResidencyCounters& c, const std::string& version);

class MetricsServer {
 public:
  // Listens on `listen` ("HOST:PORT"; port 0 picks a free one) and serves /metrics from
  // `snapshot()` (called on the server's threads; must be thread-safe and outlive the server).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              std::function<ResidencyCounters()> snapshot,
                                                              std::string version = MerVersion());

  int port() const { return endpoint_->port(); }
  // "http://HOST:PORT/metrics".
  std::string url() const { return endpoint_->url(); }

 private:
  explicit MetricsServer(std::unique_ptr<MetricsEndpoint> endpoint) : endpoint_(std::move(endpoint)) {}
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

}  // namespace mer::residency
