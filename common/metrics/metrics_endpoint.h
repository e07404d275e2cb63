// A Prometheus /metrics HTTP endpoint (prometheus-cpp's Exposer) for mer-compute, mer-gateway
// and mer-residency (its MetricsServer): listens on HOST:PORT (port 0 picks a free one) and
// serves the families of the registered collectables on every scrape.
//
// Thread-safety: construction and destruction on one thread; the collectables are called on the
// exposer's thread and must be thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace mer {

class MetricsEndpoint {
 public:
  // InvalidArgument for a malformed `listen` (the message names `flag`), Unavailable when it
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
      const std::string& flag = "--metrics-listen");
  ~MetricsEndpoint();

  int port() const { return port_; }
  // "http://HOST:PORT/metrics".
  std::string url() const;

 private:
  MetricsEndpoint() = default;
  std::string host_;
  int port_ = 0;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace mer
