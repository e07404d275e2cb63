// IoEngine over io_uring (liburing): one ring per engine, sized to io_inflight_max; every batch of
// chunk reads is one io_uring_submit; reads into a registered buffer use IORING_OP_READ_FIXED,
// reads of a registered file IOSQE_FIXED_FILE. Meant for O_DIRECT files (io_file.h), where the
// reads go straight from NVMe to the destination with many in flight, but buffered files work.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/io/chunking_io_engine.h"

struct io_uring;

namespace mer {

class UringIoEngine final : public ChunkingIoEngine {
 public:
  // Unavailable when io_uring cannot be used here (io_uring_setup fails with ENOSYS, EPERM,
  // EACCES: an old kernel, kernel.io_uring_disabled, a container's seccomp profile) or lacks
  // IORING_OP_READ (kernel < 5.6), so the caller can fall back to PreadIoEngine;
  // ResourceExhausted when the ring cannot be allocated; InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<UringIoEngine>> Create(const IoEngineOptions& options);
  ~UringIoEngine() override;

  std::string name() const override { return "uring"; }

 private:
  explicit UringIoEngine(const IoEngineOptions& options);

  absl::Status StartOps(absl::Span<const ChunkOp> ops) override;
  absl::Status ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) override;
  absl::Status OnRegisterBuffers(absl::Span<const IoBuffer> buffers) override;
  absl::Status OnRegisterFiles(absl::Span<const int> fds) override;
  int TakeCompletions(std::vector<ChunkResult>* out);

  std::unique_ptr<io_uring> ring_;
  bool ring_ready_ = false;
  bool buffers_registered_ = false;
  bool files_registered_ = false;
};

}  // namespace mer
