#include "common/systemd/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <filesystem>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mer::systemd {
namespace {

// A datagram socket standing in for systemd's notify socket.
class NotifySocket {
 public:
  explicit NotifySocket(bool abstract) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    name_ = (abstract ? "@mer-sd-notify-test-" : std::string(testing::TempDir()) + "/mer-sd-notify-") +
            std::to_string(getpid());
    std::memcpy(addr.sun_path, name_.data(), name_.size());
    if (abstract)
      addr.sun_path[0] = '\0';
    else
      unlink(name_.c_str());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name_.size());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0);
    timeval tv{2, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setenv("NOTIFY_SOCKET", name_.c_str(), 1);
  }
  ~NotifySocket() {
    unsetenv("NOTIFY_SOCKET");
    close(fd_);
    if (name_[0] == '/') unlink(name_.c_str());
  }
  std::string Receive() {
    char buf[512];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    return n < 0 ? "<nothing>" : std::string(buf, n);
  }

 private:
  int fd_ = -1;
  std::string name_;
};

TEST(SdNotify, SendsTheProtocolsMessagesToAPathSocket) {
  NotifySocket sock(/*abstract=*/false);
  NotifyReady("serving on 127.0.0.1:7000\nsecond line");
  EXPECT_EQ(sock.Receive(), "READY=1\nSTATUS=serving on 127.0.0.1:7000 second line");
  NotifyReady();
  EXPECT_EQ(sock.Receive(), "READY=1");
  NotifyExtendTimeout(absl::Seconds(90));
  EXPECT_EQ(sock.Receive(), "EXTEND_TIMEOUT_USEC=90000000");
  NotifyWatchdog();
  EXPECT_EQ(sock.Receive(), "WATCHDOG=1");
  NotifyStopping();
  EXPECT_EQ(sock.Receive(), "STOPPING=1");
}

TEST(SdNotify, AbstractNamespaceSocket) {
  NotifySocket sock(/*abstract=*/true);
  NotifyStatus("loading");
  EXPECT_EQ(sock.Receive(), "STATUS=loading");
}

// Without a socket, or with a socket path systemd would never give (relative), a notification
// does nothing: it returns at once and creates nothing where the path points.
TEST(SdNotify, NoSocketIsANoOp) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / ("sd_notify_noop_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  const absl::Time t0 = absl::Now();
  unsetenv("NOTIFY_SOCKET");
  NotifyReady("x");
  setenv("NOTIFY_SOCKET", "relative/path", 1);
  NotifyReady("x");
  NotifyStatus("y");
  unsetenv("NOTIFY_SOCKET");
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "a notification wrote into the working directory";
  std::filesystem::current_path(cwd);
  std::filesystem::remove_all(dir);
}

TEST(SdNotify, WatchdogIntervalIsHalfOfWatchdogUsec) {
  unsetenv("WATCHDOG_PID");
  unsetenv("WATCHDOG_USEC");
  EXPECT_EQ(WatchdogPingInterval(), absl::ZeroDuration());
  setenv("WATCHDOG_USEC", "30000000", 1);
  EXPECT_EQ(WatchdogPingInterval(), absl::Seconds(15));
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  EXPECT_EQ(WatchdogPingInterval(), absl::Seconds(15));
  setenv("WATCHDOG_PID", std::to_string(getpid() + 1).c_str(), 1);  // meant for another process
  EXPECT_EQ(WatchdogPingInterval(), absl::ZeroDuration());
  setenv("WATCHDOG_USEC", "junk", 1);
  unsetenv("WATCHDOG_PID");
  EXPECT_EQ(WatchdogPingInterval(), absl::ZeroDuration());
  unsetenv("WATCHDOG_USEC");
}

TEST(SdNotify, WatchdogPacerPingsOncePerIntervalAndOnlyWhenAlive) {
  unsetenv("WATCHDOG_PID");
  setenv("WATCHDOG_USEC", "200000", 1);  // ping every 100 ms
  NotifySocket sock(/*abstract=*/false);
  WatchdogPacer pacer;
  EXPECT_EQ(pacer.interval(), absl::Milliseconds(100));
  int asked = 0;
  pacer.MaybePing([&] {
    ++asked;
    return true;
  });
  EXPECT_EQ(sock.Receive(), "WATCHDOG=1");
  pacer.MaybePing([&] {
    ++asked;
    return true;
  });  // not due yet: not even asked
  EXPECT_EQ(asked, 1);
  absl::SleepFor(absl::Milliseconds(120));
  pacer.MaybePing([&] {
    ++asked;
    return false;
  });  // due, but the work is stuck: no ping
  EXPECT_EQ(asked, 2);
  NotifyStatus("after");
  EXPECT_EQ(sock.Receive(), "STATUS=after");  // the next datagram: nothing was pinged in between
  unsetenv("WATCHDOG_USEC");
  WatchdogPacer off;
  off.MaybePing([&] {
    ++asked;
    return true;
  });  // no watchdog: never asks
  EXPECT_EQ(asked, 2);
}

}  // namespace
}  // namespace mer::systemd
