// What reads through an IoEngine need from the file system: files opened for O_DIRECT reads
// (with a fallback to buffered reads where the file system refuses O_DIRECT, e.g. tmpfs before
// Linux 6.6 or some overlay set-ups) and destination buffers aligned for O_DIRECT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mer {

// The alignment mer uses for O_DIRECT offsets, lengths and buffers: the store's blob alignment,
// a multiple of every NVMe logical block size in use (512 or 4096).
inline constexpr uint64_t kDirectIoAlignment = 4096;

enum class DirectIo {
  kOff,      // buffered reads through the page cache
  kPrefer,   // O_DIRECT if the file system supports it, else buffered
  kRequire,  // O_DIRECT or an error
};

// A file open read-only; closes on destruction.
class ReadOnlyFile {
 public:
  // NotFound / PermissionDenied / ... naming the path; with kRequire, FailedPrecondition when
  // the file system does not support O_DIRECT. O_DIRECT support is tested with an aligned read of
  // the first block, since some file systems accept the flag and then fail every read.
  static absl::StatusOr<ReadOnlyFile> Open(const std::string& path, DirectIo direct);

  ReadOnlyFile() = default;
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  int fd() const { return fd_; }
  bool direct() const { return direct_; }  // opened with O_DIRECT
  uint64_t size() const { return size_; }  // at open time
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  bool direct_ = false;
  uint64_t size_ = 0;
  std::string path_;
};

// Heap memory aligned for O_DIRECT (and registrable with io_uring: whole anonymous pages).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `size` is rounded up to a multiple of `alignment` (a power of two >= 4096); the memory is
  // zeroed. CHECK-fails when out of memory.
  explicit AlignedBuffer(size_t size, size_t alignment = kDirectIoAlignment);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  absl::Span<uint8_t> span() { return {data_, size_}; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mer
