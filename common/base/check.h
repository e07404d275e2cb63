// CHECK for programmer errors: the condition is an invariant of the code, not of its input.
// On failure it prints file, line and the condition, then aborts (systemd restarts a daemon).
// Operating errors (bad input, I/O failure, dead peer) are returned as absl::Status instead.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace mer::internal {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* condition, const char* message) {
  std::fprintf(stderr, "%s:%d: CHECK failed: %s %s\n", file, line, condition, message);
  std::fflush(stderr);
  std::abort();
}
}  // namespace mer::internal

#define CHECK(condition)                                                                \
  do {                                                                                  \
    if (!(condition)) ::mer::internal::CheckFailed(__FILE__, __LINE__, #condition, ""); \
  } while (0)

#define CHECK_MSG(condition, message)                                                          \
  do {                                                                                         \
    if (!(condition)) ::mer::internal::CheckFailed(__FILE__, __LINE__, #condition, (message)); \
  } while (0)
