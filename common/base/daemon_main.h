// The main() of each mer daemon: --help, --version, argument errors (exit 2), SIGTERM/SIGINT as a stop
// request, SIGPIPE ignored (a peer that hangs up must not kill the daemon), the daemon's own run,
// and its error (exit 1), each printed as "NAME: message".
#pragma once

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "mer/version.h"

namespace mer {

// Set by SIGTERM and SIGINT once DaemonMain has installed its handlers; the daemon's loops poll it.
inline std::atomic<bool>& StopRequested() {
  static std::atomic<bool> stop{false};
  return stop;
}

// Runs `parse(argc, argv, &args)` then `run(args)`.
template <typename Args>
int DaemonMain(const char* name, const char* help, int argc, char** argv, absl::Status (*parse)(int, char**, Args*),
               absl::Status (*run)(const Args&)) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0) {
      std::fputs(help, stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s\n", name, MER_VERSION_STRING);
      return 0;
    }
  }
  Args args;
  absl::Status s = parse(argc, argv, &args);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n%s", name, std::string(s.message()).c_str(), help);
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { StopRequested().store(true); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  s = run(args);
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace mer
