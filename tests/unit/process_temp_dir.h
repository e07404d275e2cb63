// A temporary directory for a test process, named after its pid.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace mer::testing_support {

// The directory temp_directory_path() / (prefix + pid) of this process: emptied first, since one
// left by an earlier process with the same pid (pids wrap within a CI run) may hold a store that a
// pack refuses to overwrite, and removed when the process that made it exits. One per process: the
// first call's prefix names it.
inline const std::filesystem::path& ProcessTempDir(const char* prefix) {
  static const pid_t owner = getpid();
  static const std::filesystem::path* dir = [prefix] {
    auto* path = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                           (std::string(prefix) + std::to_string(owner)));
    std::filesystem::remove_all(*path);
    std::filesystem::create_directories(*path);
    std::atexit([] {
      std::error_code ignored;
      if (getpid() == owner) std::filesystem::remove_all(ProcessTempDir(""), ignored);
    });
    return path;
  }();
  return *dir;
}

}  // namespace mer::testing_support
