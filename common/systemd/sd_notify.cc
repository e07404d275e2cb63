#include "common/systemd/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace mer::systemd {
namespace {

// Sends one datagram to $NOTIFY_SOCKET; failures are ignored (notification is advisory, and a
// daemon must not stop serving because systemd's socket went away).
void Send(std::string_view message) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) return;
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  (void)sendto(fd, message.data(), message.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), addr_len);
  close(fd);
}

// A STATUS= value is one line.
std::string OneLine(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c == '\n') c = ' ';
  return out;
}

}  // namespace

void NotifyReady(std::string_view status) {
  Send(status.empty() ? std::string("READY=1") : absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}
void NotifyStatus(std::string_view status) { Send(absl::StrCat("STATUS=", OneLine(status))); }
void NotifyExtendTimeout(absl::Duration more) {
  Send(absl::StrCat("EXTEND_TIMEOUT_USEC=", absl::ToInt64Microseconds(more)));
}
void NotifyStopping() { Send("STOPPING=1"); }
void NotifyWatchdog() { Send("WATCHDOG=1"); }

absl::Duration WatchdogPingInterval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  int64_t us = 0;
  if (usec == nullptr || !absl::SimpleAtoi(usec, &us) || us <= 0) return absl::ZeroDuration();
  if (const char* pid = std::getenv("WATCHDOG_PID")) {
    int64_t p = 0;
    if (!absl::SimpleAtoi(pid, &p) || p != getpid()) return absl::ZeroDuration();
  }
  return absl::Microseconds(us / 2);
}

}  // namespace mer::systemd
