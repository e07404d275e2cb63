#include "common/metrics/metrics_endpoint.h"

#include <exception>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace mer {

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::vector<std::shared_ptr<prometheus::Collectable>> collectables,
    const std::string& flag) {
  const size_t colon = listen.rfind(':');
  int port;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port < 0 ||
      port > 65535)
    return absl::InvalidArgumentError(absl::StrCat(flag, ": want HOST:PORT (or off), got '", listen, "'"));
  std::unique_ptr<MetricsEndpoint> e(new MetricsEndpoint());
  e->host_ = listen.substr(0, colon);
  try {
    e->exposer_ = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/2);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", listen, ": ", ex.what()));
  }
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  if (ports.empty()) return absl::UnavailableError(absl::StrCat("metrics: not listening on ", listen));
  e->port_ = ports.front();
  e->collectables_ = std::move(collectables);
  for (const auto& c : e->collectables_) e->exposer_->RegisterCollectable(c);
  return e;
}

MetricsEndpoint::~MetricsEndpoint() {
  exposer_.reset();  // stop serving before the collectables go
}

std::string MetricsEndpoint::url() const { return absl::StrCat("http://", host_, ":", port_, "/metrics"); }

}  // namespace mer
