// IoEngine over files held in memory, for tests: a "file" is a byte string added with AddFile,
// named by the descriptor AddFile returns (not a real fd). Reads complete at once, in StartOps,
// with the syscall's semantics: bytes up to end of file (0 at or past it), EBADF for an unknown
// descriptor, and optionally short reads and O_DIRECT's alignment rule.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/chunking_io_engine.h"

namespace mer {

struct MemIoOptions {
  // Each raw read returns at most this many bytes (0: no limit), so reads longer than it are
  // short reads the engine must continue.
  uint64_t max_bytes_per_read = 0;
  // Non-zero: offset, length and destination address must be multiples of it, else EINVAL
  // (as with O_DIRECT).
  uint64_t alignment = 0;
};

class MemIoEngine final : public ChunkingIoEngine {
 public:
  static absl::StatusOr<std::unique_ptr<MemIoEngine>> Create(const IoEngineOptions& options,
                                                             const MemIoOptions& mem = {});
  ~MemIoEngine() override;

  std::string name() const override { return "mem"; }

  // Adds a file with these contents; returns its descriptor (>= 1 << 20, never a real fd's).
  int AddFile(std::string contents);
  // The contents, to change them between reads; nullptr for an unknown descriptor.
  std::string* mutable_file(int fd);

  absl::StatusOr<uint64_t> FileSize(int fd) override;

 private:
  MemIoEngine(const IoEngineOptions& options, const MemIoOptions& mem);

  absl::Status StartOps(absl::Span<const ChunkOp> ops) override;
  absl::Status ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) override;

  const MemIoOptions mem_;
  std::map<int, std::string> files_;
  int next_fd_ = 1 << 20;
  std::vector<ChunkResult> done_;
};

}  // namespace mer
