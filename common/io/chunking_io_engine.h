// The part every IoEngine shares: chunking, the queue-depth limit, reassembly, short-read
// continuation, retries and error mapping (the semantics documented in io_engine.h). A concrete
// engine supplies only the raw chunk reads: StartOps issues them, ReapOps collects their results
// (bytes read or -errno, as the syscall returned them).
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/io/io_engine.h"

namespace mer {

class ChunkingIoEngine : public IoEngine {
 public:
  ~ChunkingIoEngine() override = default;
  ChunkingIoEngine(const ChunkingIoEngine&) = delete;
  ChunkingIoEngine& operator=(const ChunkingIoEngine&) = delete;

  const IoEngineOptions& options() const final { return options_; }
  absl::Status RegisterBuffers(absl::Span<const IoBuffer> buffers) final;
  absl::Status RegisterFiles(absl::Span<const int> fds) final;
  absl::Status Submit(absl::Span<const ReadRequest> requests) final;
  absl::StatusOr<int> Wait(int min_completions, absl::Duration timeout, std::vector<ReadCompletion>* out) final;
  int64_t outstanding() const final { return outstanding_; }
  int inflight() const final { return inflight_; }
  IoEngineStats stats() const final { return stats_; }
  absl::StatusOr<uint64_t> FileSize(int fd) override;  // fstat

 protected:
  // One raw read. `id` (< io_inflight_max) comes back in its result. buffer_index: the index of
  // the registered buffer holding [dest, dest + length), or -1. file_index: the fd's index among
  // the registered files, or -1.
  struct ChunkOp {
    uint64_t id = 0;
    int fd = -1;
    uint64_t offset = 0;
    uint32_t length = 0;
    uint8_t* dest = nullptr;
    int buffer_index = -1;
    int file_index = -1;
  };
  // result: bytes read (>= 0) or -errno. A non-OK status (an engine layered on another, whose
  // errors are already statuses) is taken as the chunk's error as is.
  struct ChunkResult {
    uint64_t id = 0;
    int64_t result = 0;
    absl::Status status;
  };

  // `options` must have passed ValidateIoEngineOptions.
  explicit ChunkingIoEngine(const IoEngineOptions& options);

  // Issues all `ops` (their count never exceeds the free queue depth). An error breaks the
  // engine: every later call returns it.
  virtual absl::Status StartOps(absl::Span<const ChunkOp> ops) = 0;
  // Appends results of issued ops; with min_results > 0 waits until that many were appended or
  // `deadline` passed (returning OK with fewer), with 0 only takes what is there.
  virtual absl::Status ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) = 0;
  // Called with validated arguments and nothing in flight.
  virtual absl::Status OnRegisterBuffers(absl::Span<const IoBuffer> buffers) { return absl::OkStatus(); }
  virtual absl::Status OnRegisterFiles(absl::Span<const int> fds) { return absl::OkStatus(); }

  // For the destructors of concrete engines (before they tear down what ReapOps uses): waits up
  // to `timeout` for the chunk reads in flight, dropping their results and everything queued.
  void DrainForShutdown(absl::Duration timeout);

 private:
  struct Request {
    uint64_t tag = 0;
    int fd = -1;
    uint64_t offset = 0;
    uint64_t length = 0;
    int chunks_left = 0;  // queued + in flight
    absl::Status status;  // the first error
  };
  struct Chunk {
    uint32_t request = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint8_t* dest = nullptr;
    int retries = 0;
  };
  struct Registered {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    int index = 0;
  };

  absl::Status Pump();  // issues queued chunks while the queue depth allows
  void Process(const ChunkResult& result);
  void Fail(uint32_t request, absl::Status status);
  void FinishChunk(uint32_t request);
  int BufferIndex(const uint8_t* dest, uint64_t length) const;
  std::string Describe(const Request& r, const Chunk& c) const;

  const IoEngineOptions options_;
  absl::Status broken_;
  std::vector<Request> requests_;
  std::vector<uint32_t> free_requests_;
  std::deque<Chunk> queued_;
  std::vector<Chunk> slots_;  // chunks in flight, by op id
  std::vector<uint32_t> free_slots_;
  int inflight_ = 0;
  int64_t outstanding_ = 0;
  std::vector<ReadCompletion> ready_;  // completed, not yet returned by Wait
  std::vector<Registered> buffers_;    // sorted by begin
  std::unordered_map<int, int> file_index_;
  std::vector<ChunkOp> op_scratch_;
  std::vector<ChunkResult> result_scratch_;
  IoEngineStats stats_;
};

}  // namespace mer
