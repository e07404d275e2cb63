// Whether the mer-residency instance mer-compute gets its experts from is reachable, watched from
// a thread of its own (ShmSegment::Probe every `poll`), so that an outage is visible at once: the
// gateway learns it from GetInfo (health NOT_SERVING, new calls UNAVAILABLE naming the cause),
// Generate refuses new calls instead of waiting out the re-attach timeout, and the log says when
// the residency goes and when it is back. The expert source still re-attaches by itself; this
// only observes.
//
// Thread-safety: status() may be called from any thread.
#pragma once

#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/shm/layout.h"

namespace mer::compute {

struct ResidencyMonitorOptions {
  absl::Duration poll = absl::Milliseconds(200);       // between probes
  absl::Duration liveness_timeout = absl::Seconds(2);  // a heartbeat older than this is down
};

class ResidencyMonitor {
 public:
  // Starts probing instance `name` for a segment of `expected`. The first probe runs before the
  // constructor returns.
  ResidencyMonitor(std::string name, shm::ExpectedIdentity expected, const ResidencyMonitorOptions& options = {});
  ~ResidencyMonitor();  // stops the thread
  ResidencyMonitor(const ResidencyMonitor&) = delete;
  ResidencyMonitor& operator=(const ResidencyMonitor&) = delete;

  // OK while reachable; Unavailable "mer-residency instance 'NAME' is unreachable: WHY".
  absl::Status status() const;

 private:
  void Probe();

  const std::string name_;
  const shm::ExpectedIdentity expected_;
  const ResidencyMonitorOptions options_;
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mer::compute
