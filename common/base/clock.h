// The clock seam: where a daemon reads the time it measures and schedules by (latencies, stalls,
// census and print intervals), so that tests can set the time instead of sleeping. Waiting is not
// part of it: a daemon that sleeps or blocks does so in real time whatever its clock says.
//
// Thread-safety: Now() may be called from any thread; a FakeClock may be set from any thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mer {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  int64_t NowNanos() const { return absl::ToUnixNanos(Now()); }
};

// absl::Now(); one for the process, never destroyed.
inline Clock* RealClock() {
  class Real final : public Clock {
   public:
    absl::Time Now() const override { return absl::Now(); }
  };
  static Real* clock = new Real();
  return clock;
}

// Stands still until told to move (tests).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000)) : nanos_(absl::ToUnixNanos(start)) {}
  absl::Time Now() const override { return absl::FromUnixNanos(nanos_.load(std::memory_order_acquire)); }
  void Advance(absl::Duration d) { nanos_.fetch_add(absl::ToInt64Nanoseconds(d), std::memory_order_acq_rel); }

 private:
  std::atomic<int64_t> nanos_;
};

}  // namespace mer
