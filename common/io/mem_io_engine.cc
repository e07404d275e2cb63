#include "common/io/mem_io_engine.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer {

MemIoEngine::MemIoEngine(const IoEngineOptions& options, const MemIoOptions& mem)
    : ChunkingIoEngine(options), mem_(mem) {}

absl::StatusOr<std::unique_ptr<MemIoEngine>> MemIoEngine::Create(const IoEngineOptions& options,
                                                                 const MemIoOptions& mem) {
  RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  return std::unique_ptr<MemIoEngine>(new MemIoEngine(options, mem));
}

MemIoEngine::~MemIoEngine() { DrainForShutdown(absl::Seconds(1)); }

int MemIoEngine::AddFile(std::string contents) {
  const int fd = next_fd_++;
  files_.emplace(fd, std::move(contents));
  return fd;
}

std::string* MemIoEngine::mutable_file(int fd) {
  auto it = files_.find(fd);
  return it == files_.end() ? nullptr : &it->second;
}

absl::StatusOr<uint64_t> MemIoEngine::FileSize(int fd) {
  auto it = files_.find(fd);
  if (it == files_.end()) return absl::NotFoundError(absl::StrCat("no mem file with fd ", fd));
  return it->second.size();
}

absl::Status MemIoEngine::StartOps(absl::Span<const ChunkOp> ops) {
  for (const ChunkOp& op : ops) {
    ChunkResult r;
    r.id = op.id;
    auto it = files_.find(op.fd);
    const uint64_t a = mem_.alignment;
    if (it == files_.end()) {
      r.result = -EBADF;
    } else if (a != 0 && (op.offset % a != 0 || op.length % a != 0 || reinterpret_cast<uintptr_t>(op.dest) % a != 0)) {
      r.result = -EINVAL;
    } else {
      const std::string& file = it->second;
      uint64_t n = op.offset >= file.size() ? 0 : std::min<uint64_t>(op.length, file.size() - op.offset);
      if (mem_.max_bytes_per_read > 0) n = std::min(n, mem_.max_bytes_per_read);
      if (n > 0) std::memcpy(op.dest, file.data() + op.offset, n);
      r.result = static_cast<int64_t>(n);
    }
    done_.push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status MemIoEngine::ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) {
  // Every issued read completed in StartOps, so there is never anything to wait for.
  for (ChunkResult& r : done_) out->push_back(std::move(r));
  done_.clear();
  return absl::OkStatus();
}

}  // namespace mer
