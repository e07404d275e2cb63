// The daemons' side of systemd's service notification protocol (sd_notify(3)), written against
// the protocol rather than libsystemd: a datagram of "KEY=VALUE\n" lines to the unix socket named
// by $NOTIFY_SOCKET (a path, or '@' for the abstract namespace). Without $NOTIFY_SOCKET (not
// started by systemd, or Type= is not notify) every call does nothing, so the daemons call these
// unconditionally.
//
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <string_view>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mer::systemd {

// READY=1: the service is up (model loaded, ports bound). `status` becomes STATUS=.
void NotifyReady(std::string_view status = {});
// STATUS=...: a one-line state shown by `systemctl status`.
void NotifyStatus(std::string_view status);
// EXTEND_TIMEOUT_USEC=: asks for `more` time before systemd gives up on start-up (loading a big
// model); send it again before it runs out.
void NotifyExtendTimeout(absl::Duration more);
// STOPPING=1: shutdown has begun.
void NotifyStopping();
// WATCHDOG=1: the keep-alive ping of WatchdogSec=.
void NotifyWatchdog();

// Half of $WATCHDOG_USEC (how often to ping), or absl::ZeroDuration() when no watchdog is set for
// this process ($WATCHDOG_PID, when present, must be our pid).
absl::Duration WatchdogPingInterval();

// The pacing of watchdog pings for a daemon's loop: call MaybePing as often as convenient (every
// few tens of milliseconds); once per WatchdogPingInterval() it asks `alive()` whether the work
// the watchdog guards still makes progress and pings only if so, so that a wedged loop, not only a
// dead process, gets the daemon restarted. Does nothing without a watchdog. One thread.
class WatchdogPacer {
 public:
  WatchdogPacer() : interval_(WatchdogPingInterval()), next_(absl::Now()) {}
  absl::Duration interval() const { return interval_; }

  template <typename Alive>
  void MaybePing(const Alive& alive) {
    if (interval_ <= absl::ZeroDuration() || absl::Now() < next_) return;
    if (alive()) NotifyWatchdog();
    next_ = absl::Now() + interval_;
  }

 private:
  const absl::Duration interval_;
  absl::Time next_;
};

}  // namespace mer::systemd
