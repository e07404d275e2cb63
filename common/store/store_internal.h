// Helpers shared by the expert store's reader and packer (not a public interface).
#pragma once

#include <cstdint>
#include <string>

#include <functional>
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mer::store_internal {

// NotFound for ENOENT, PermissionDenied for EACCES/EPERM, Unavailable for other errors:
// "<what> <path>: <strerror>".
absl::Status ErrnoStatus(int err, absl::string_view what, const std::string& path);

// pread/pwrite of exactly n bytes, retrying on EINTR and partial transfers. PreadFull reports a
// read that ends early at end of file as DataLoss.
absl::Status PreadFull(int fd, void* buf, uint64_t n, uint64_t offset, const std::string& path);
absl::Status PwriteFull(int fd, const void* buf, uint64_t n, uint64_t offset, const std::string& path);

// Runs fn(i) for i in [0, n) on up to `threads` threads (the caller is one of them); items are
// handed out one at a time through an atomic counter.
void ParallelFor(int64_t n, int threads, const std::function<void(int64_t)>& fn);

std::string JoinPath(const std::string& dir, const char* file);

}  // namespace mer::store_internal
