#include "common/io/io_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/io/io_engine.h"

namespace mer {
namespace {

absl::Status OpenError(const std::string& path, const char* what, int err) {
  return absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat(what, " ", path, ": ", ErrnoName(err)));
}

}  // namespace

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path, DirectIo direct) {
  ReadOnlyFile file;
  file.path_ = path;
  std::string direct_problem;
  if (direct != DirectIo::kOff) {
    file.fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (file.fd_ < 0) {
      if (errno != EINVAL) return OpenError(path, "open (O_DIRECT)", errno);
      direct_problem = "open with O_DIRECT: EINVAL";
    } else {
      // Some file systems take the flag and fail the reads; try the first block.
      AlignedBuffer probe(kDirectIoAlignment);
      if (pread(file.fd_, probe.data(), probe.size(), 0) < 0) {
        direct_problem = absl::StrCat("an O_DIRECT read: ", ErrnoName(errno));
        close(file.fd_);
        file.fd_ = -1;
      } else {
        file.direct_ = true;
      }
    }
    if (!file.direct_ && direct == DirectIo::kRequire) {
      return absl::FailedPreconditionError(
          absl::StrCat("O_DIRECT is not supported for ", path, " (", direct_problem, ")"));
    }
  }
  if (file.fd_ < 0) {
    file.fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (file.fd_ < 0) return OpenError(path, "open", errno);
  }
  struct stat st;
  if (fstat(file.fd_, &st) != 0) return OpenError(path, "fstat", errno);
  file.size_ = static_cast<uint64_t>(st.st_size);
  return file;
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), direct_(other.direct_), size_(other.size_), path_(std::move(other.path_)) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    direct_ = other.direct_;
    size_ = other.size_;
    path_ = std::move(other.path_);
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) close(fd_);
}

AlignedBuffer::AlignedBuffer(size_t size, size_t alignment) {
  CHECK(alignment >= kDirectIoAlignment && (alignment & (alignment - 1)) == 0);
  size_ = (size + alignment - 1) / alignment * alignment;
  if (size_ == 0) return;
  data_ = static_cast<uint8_t*>(std::aligned_alloc(alignment, size_));
  CHECK_MSG(data_ != nullptr, "AlignedBuffer: out of memory");
  std::memset(data_, 0, size_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

}  // namespace mer
