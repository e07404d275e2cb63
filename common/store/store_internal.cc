#include "common/store/store_internal.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/threads.h"

namespace mer::store_internal {

absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::UnavailableError(message);
}

absl::Status PreadFull(int fd, void* buf, uint64_t n, uint64_t offset, const std::string& path) {
  uint8_t* p = static_cast<uint8_t*>(buf);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading", path);
    }
    if (r == 0)
      return absl::DataLossError(absl::StrCat("reading ", path, ": end of file at byte ", offset + done, ", expected ",
                                              n - done, " more bytes"));
    done += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status PwriteFull(int fd, const void* buf, uint64_t n, uint64_t offset, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(buf);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "writing", path);
    }
    done += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

void ParallelFor(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  const int t = static_cast<int>(std::min<int64_t>(ResolveThreads(threads), n));
  if (t <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  const auto work = [&] {
    for (int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < t; ++i) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
}

std::string JoinPath(const std::string& dir, const char* file) {
  if (dir.empty()) return file;
  return dir.back() == '/' ? absl::StrCat(dir, file) : absl::StrCat(dir, "/", file);
}

}  // namespace mer::store_internal
