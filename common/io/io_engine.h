// The I/O seam of mer-residency: batched asynchronous reads of expert blobs from the expert store.
//
// Like LevelDB's Env, IoEngine is the one abstract door to the operating system's read path, so
// the residency daemon can run over io_uring (UringIoEngine), a pool of pread threads
// (PreadIoEngine: the fallback where io_uring is unavailable), an in-memory fake (MemIoEngine)
// or a fault injector wrapping any of them (FaultInjectingIoEngine), and tests exercise the same
// code paths the daemon uses.
//
// The model: Submit hands over a batch of reads and never blocks; Wait reaps completions, exactly
// one per submitted request. Underneath, every engine (they all derive from ChunkingIoEngine)
//   - splits a read longer than `chunk_bytes` into chunk reads, so a 5 MiB expert blob becomes
//     several reads in flight at once, and reassembles them: one completion per request;
//   - keeps at most `io_inflight_max` chunk reads in flight at the OS (the queue depth); chunks
//     beyond it wait in a software queue and are issued, in order, as reads complete;
//   - continues a short read (resubmits for the remainder) and retries EINTR/EAGAIN a few times;
//   - turns end of file before `length` bytes into OutOfRange, and an errno into an absl error
//     naming the file offset and length (EIO and ENODATA, a media error: DataLoss; EINVAL, e.g.
//     a misaligned O_DIRECT read: InvalidArgument; the rest as absl::ErrnoToStatusCode maps them).
//   A request whose chunk failed completes once its chunks already in flight have finished (the
//   destination is written until then) with the first error; its chunks not yet issued are
//   dropped.
//
// Files are plain file descriptors the caller opened (see io_file.h for O_DIRECT opening and
// aligned buffers). With O_DIRECT the offset, length and destination of every read must be
// aligned to the device's logical block size; blobs in the store are 4096-aligned, so are chunks
// (chunk_bytes is a multiple of 4096). The engine does not check alignment: the kernel does
// (EINVAL -> InvalidArgument).
//
// Thread-safety: an engine is used by one thread at a time (the residency daemon gives each I/O
// thread its own engine, as it would give each its own io_uring). Destroying an engine with reads
// in flight waits (bounded) for them to finish and drops their completions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace mer {

// One read: `length` bytes of the file `fd` from `offset` into `dest`. `tag` is the caller's and
// comes back in the completion (it need not be unique).
struct ReadRequest {
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;  // > 0
  void* dest = nullptr;
  uint64_t tag = 0;
};

struct ReadCompletion {
  uint64_t tag = 0;
  absl::Status status;  // OK: all `length` bytes of the request are in `dest`
  uint64_t bytes = 0;   // the request's length when OK, 0 otherwise
};

// A memory region for RegisterBuffers.
struct IoBuffer {
  void* data = nullptr;
  size_t size = 0;
};

struct IoEngineOptions {
  // Chunk reads in flight at the OS at once (the queue depth), 1..4096.
  int io_inflight_max = 64;
  // Reads longer than this are split into chunks of this size; a multiple of 4096, <= 1 GiB.
  uint64_t chunk_bytes = uint64_t{1} << 20;
  // PreadIoEngine: worker threads, each with one pread in flight; 0 = min(io_inflight_max, 8).
  int pread_threads = 0;
};

// Counters since the engine was created.
struct IoEngineStats {
  uint64_t requests_submitted = 0;
  uint64_t requests_completed = 0;  // completions produced, errors included
  uint64_t requests_failed = 0;
  uint64_t chunks_issued = 0;        // reads handed to the OS, continuations and retries included
  uint64_t fixed_buffer_chunks = 0;  // of those, into a registered buffer (READ_FIXED on io_uring)
  uint64_t fixed_file_chunks = 0;    // of those, on a registered file
  uint64_t short_reads = 0;          // reads that returned fewer bytes than asked, then continued
  uint64_t retries = 0;              // EINTR/EAGAIN resubmissions
  uint64_t bytes_read = 0;
  int max_inflight = 0;  // the most chunk reads in flight at once
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "uring", "pread", "mem", "fault(<inner>)".
  virtual std::string name() const = 0;
  virtual const IoEngineOptions& options() const = 0;

  // Declares the memory reads will land in (replacing an earlier registration; an empty span
  // drops it). io_uring pins it and reads whose destination lies within one buffer use
  // IORING_OP_READ_FIXED; other engines accept and ignore it. Only with no reads in flight
  // (FailedPrecondition otherwise). Each buffer at most 1 GiB, at most 16384 buffers, anonymous
  // or hugetlbfs memory; pinning counts against RLIMIT_MEMLOCK for unprivileged users
  // (ResourceExhausted when over it). Reads outside the registered buffers still work.
  virtual absl::Status RegisterBuffers(absl::Span<const IoBuffer> buffers) = 0;

  // Declares the files reads will use (replacing an earlier registration), so io_uring need not
  // look the descriptor up per read. Requests keep naming the plain fd. Only with no reads in
  // flight; the fds must stay open while registered.
  virtual absl::Status RegisterFiles(absl::Span<const int> fds) = 0;

  // Queues the batch and issues as many chunk reads as the queue depth allows (on io_uring, one
  // io_uring_submit for the batch). Never blocks waiting for the device. InvalidArgument (and
  // nothing of the batch queued) if a request has fd < 0, no destination or length 0; the
  // engine's error if it is broken.
  virtual absl::Status Submit(absl::Span<const ReadRequest> requests) = 0;

  // Appends completions to `out` and returns how many. Waits until at least min_completions are
  // available (capped at outstanding(), so it cannot wait for completions that cannot come) or
  // until `timeout` has passed (then it returns fewer; not an error). min_completions = 0 polls.
  // Read errors come in the completions; an error returned here means the engine itself broke.
  virtual absl::StatusOr<int> Wait(int min_completions, absl::Duration timeout, std::vector<ReadCompletion>* out) = 0;

  // Requests submitted whose completion Wait has not returned yet.
  virtual int64_t outstanding() const = 0;
  // Chunk reads in flight at the OS now (<= options().io_inflight_max).
  virtual int inflight() const = 0;
  virtual IoEngineStats stats() const = 0;

  // The size of `fd` as this engine sees it (fstat for real files). Used to tell end of file
  // from a short read.
  virtual absl::StatusOr<uint64_t> FileSize(int fd) = 0;
};

enum class IoEngineKind { kAuto, kUring, kPread };

absl::string_view IoEngineKindName(IoEngineKind kind);  // "auto", "uring", "pread"
absl::StatusOr<IoEngineKind> ParseIoEngineKind(absl::string_view name);

struct CreatedIoEngine {
  std::unique_ptr<IoEngine> engine;
  IoEngineKind kind = IoEngineKind::kPread;  // what was created: kUring or kPread
  std::string fallback_reason;               // with kAuto, why io_uring was not used; empty otherwise
};

// kUring: io_uring or its error (Unavailable when io_uring cannot be used here, e.g. ENOSYS or
// EPERM under a container's seccomp profile). kPread: the thread pool. kAuto: io_uring if it can
// be created, otherwise pread, with the reason in fallback_reason. InvalidArgument for bad
// options.
absl::StatusOr<CreatedIoEngine> CreateIoEngine(IoEngineKind kind, const IoEngineOptions& options);

// Checks options (ranges, chunk_bytes a multiple of 4096).
absl::Status ValidateIoEngineOptions(const IoEngineOptions& options);

// "EIO (Input/output error)".
std::string ErrnoName(int error_number);

}  // namespace mer
