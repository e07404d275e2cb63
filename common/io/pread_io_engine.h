// IoEngine over a small pool of threads doing blocking pread: the fallback where io_uring cannot
// be used. Each worker has one read in flight, so at most min(io_inflight_max, pread_threads)
// reads are at the device at once. Works with O_DIRECT and buffered files alike (io_file.h opens
// with O_DIRECT where the file system allows it).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/io/chunking_io_engine.h"

namespace mer {

class PreadIoEngine final : public ChunkingIoEngine {
 public:
  // InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<PreadIoEngine>> Create(const IoEngineOptions& options);
  ~PreadIoEngine() override;

  std::string name() const override { return "pread"; }
  int threads() const { return static_cast<int>(workers_.size()); }

 private:
  explicit PreadIoEngine(const IoEngineOptions& options);

  absl::Status StartOps(absl::Span<const ChunkOp> ops) override;
  absl::Status ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) override;
  void Work();

  std::mutex mu_;
  std::condition_variable work_cv_;  // queue_ got work, or stop_
  std::condition_variable done_cv_;  // done_ got results
  std::deque<ChunkOp> queue_;
  std::vector<ChunkResult> done_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace mer
