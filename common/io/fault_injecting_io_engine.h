// An IoEngine that wraps another and injects faults into its chunk reads: errors (EIO or any
// errno), short reads, latency, and bit flips in the data returned. Faults apply to each chunk
// read (a continuation or retry is a new chunk read) and are decided, in the order reads are
// issued, by a generator seeded from `seed`: the same submissions give the same faults.
//
// The injector is itself a ChunkingIoEngine whose raw reads are requests to the inner engine, so
// what it injects goes through the same continuation, retry and error code as real faults do:
// an injected short read is continued, an injected EAGAIN retried, an injected EIO becomes a
// DataLoss naming the file offset. Bit flips are delivered as data (the read succeeds): catching
// them is the checksum layer's job above.
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/io/chunking_io_engine.h"

namespace mer {

enum class FaultKind { kError, kShortRead, kDelay, kBitFlip };

// A fault for chunk reads of file `fd` (-1: any) that overlap [offset_begin, offset_end).
struct FaultRule {
  FaultKind kind = FaultKind::kError;
  int fd = -1;
  uint64_t offset_begin = 0;
  uint64_t offset_end = UINT64_MAX;
  double probability = 1.0;                       // per matching read
  int64_t times = -1;                             // how many times it fires; -1: every time
  int error = EIO;                                // kError: the errno the read fails with
  uint64_t short_bytes = 0;                       // kShortRead: bytes the read returns; 0: half, aligned down
  absl::Duration delay = absl::Milliseconds(10);  // kDelay: the read completes no sooner
  int bit_flips = 1;  // kBitFlip: bits flipped, inside [offset_begin, offset_end) and the read
};

struct FaultInjectionOptions {
  uint64_t seed = 1;
  // Faults for every chunk read, each with its probability.
  double error_probability = 0;
  int error = EIO;
  double short_read_probability = 0;
  double delay_probability = 0;
  absl::Duration delay = absl::Milliseconds(10);
  double bit_flip_probability = 0;
  // Injected short reads return a multiple of this (so an O_DIRECT continuation stays aligned);
  // a read no longer than it is never shortened.
  uint64_t short_read_alignment = 4096;
  std::vector<FaultRule> rules;
};

// Options from a spec such as "seed=7,eio=0.01,short=0.05,flip=0.002,delay=0.01,delay_ms=20":
// per chunk read, the probability of an EIO, of a short read, of a bit flip, of a delay (of
// delay_ms). For `mer-residency --io-faults` (soak tests). InvalidArgument naming a bad item.
absl::StatusOr<FaultInjectionOptions> ParseFaultInjectionSpec(absl::string_view spec);

struct FaultStats {
  uint64_t reads = 0;  // chunk reads seen
  uint64_t errors = 0;
  uint64_t short_reads = 0;
  uint64_t delays = 0;
  uint64_t bit_flips = 0;  // bits flipped
};

class FaultInjectingIoEngine final : public ChunkingIoEngine {
 public:
  // Uses the inner engine's options (chunk size, queue depth).
  static absl::StatusOr<std::unique_ptr<FaultInjectingIoEngine>> Create(std::unique_ptr<IoEngine> inner,
                                                                        const FaultInjectionOptions& options);
  ~FaultInjectingIoEngine() override;

  std::string name() const override { return "fault(" + inner_->name() + ")"; }
  absl::StatusOr<uint64_t> FileSize(int fd) override { return inner_->FileSize(fd); }

  void AddRule(const FaultRule& rule) { faults_.rules.push_back(rule); }
  // Drops the rules and the per-read probabilities: reads pass through untouched.
  void ClearFaults();
  IoEngine& inner() { return *inner_; }
  const FaultStats& fault_stats() const { return stats_; }

 private:
  struct OpState {
    ChunkOp op;
    uint64_t ask = 0;             // bytes asked of the inner engine (< op.length: short read)
    std::vector<uint64_t> flips;  // file bit positions to flip
    absl::Time not_before;
  };
  struct Held {
    absl::Time not_before;
    ChunkResult result;
  };

  FaultInjectingIoEngine(std::unique_ptr<IoEngine> inner, const FaultInjectionOptions& options);

  absl::Status StartOps(absl::Span<const ChunkOp> ops) override;
  absl::Status ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) override;
  absl::Status OnRegisterBuffers(absl::Span<const IoBuffer> buffers) override {
    return inner_->RegisterBuffers(buffers);
  }
  absl::Status OnRegisterFiles(absl::Span<const int> fds) override { return inner_->RegisterFiles(fds); }
  bool Roll(double probability);
  void AddFlips(uint64_t begin, uint64_t end, int count, OpState* s);
  // Decides the faults of one read; returns the errno to fail it with, or 0.
  int Decide(OpState* s, absl::Time now);
  absl::Status CollectInner(absl::Duration timeout);
  int ReleaseDue(std::vector<ChunkResult>* out);

  std::unique_ptr<IoEngine> inner_;
  FaultInjectionOptions faults_;
  std::mt19937_64 rng_;
  std::vector<OpState> ops_;  // by op id
  std::vector<Held> held_;    // results not yet handed up (delayed, or failed without a read)
  std::vector<ReadRequest> batch_;
  std::vector<ReadCompletion> inner_done_;
  FaultStats stats_;
};

}  // namespace mer
