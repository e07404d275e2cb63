#include "services/compute/daemon/residency_monitor.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/shm/segment.h"

namespace mer::compute {

ResidencyMonitor::ResidencyMonitor(std::string name, shm::ExpectedIdentity expected,
                                   const ResidencyMonitorOptions& options)
    : name_(std::move(name)), expected_(expected), options_(options) {
  Probe();
  thread_ = std::thread([this] {
    absl::MutexLock lock(&mu_);
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    while (!mu_.AwaitWithTimeout(absl::Condition(&stopped), options_.poll)) {
      mu_.Unlock();
      Probe();
      mu_.Lock();
    }
  });
}

ResidencyMonitor::~ResidencyMonitor() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Status ResidencyMonitor::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

void ResidencyMonitor::Probe() {
  const absl::Status probe = shm::ShmSegment::Probe(name_, expected_, options_.liveness_timeout);
  const absl::Status now = probe.ok() ? absl::OkStatus()
                                      : absl::UnavailableError(absl::StrCat("mer-residency instance '", name_,
                                                                            "' is unreachable: ", probe.message()));
  absl::MutexLock lock(&mu_);
  if (now.ok() != status_.ok()) {
    if (now.ok()) {
      std::fprintf(stderr, "mer-compute: mer-residency instance '%s' is reachable again\n", name_.c_str());
    } else {
      std::fprintf(stderr, "mer-compute: %s; new calls get UNAVAILABLE until it is back\n",
                   std::string(now.message()).c_str());
    }
  }
  status_ = now;
}

}  // namespace mer::compute
