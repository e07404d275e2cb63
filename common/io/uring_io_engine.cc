#include "common/io/uring_io_engine.h"

#include <liburing.h>
#include <sys/uio.h>

#include <cerrno>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"

namespace mer {
namespace {

// io_uring_submit returning EAGAIN/EBUSY/EINTR (no memory for requests, CQ backlog) is retried
// this many times, a little apart, before the engine gives up.
constexpr int kSubmitAttempts = 100;

absl::Status UringError(const char* what, int err) {
  return absl::Status(absl::ErrnoToStatusCode(err), absl::StrCat("io_uring: ", what, ": ", ErrnoName(err)));
}

}  // namespace

UringIoEngine::UringIoEngine(const IoEngineOptions& options)
    : ChunkingIoEngine(options), ring_(std::make_unique<io_uring>()) {}

absl::StatusOr<std::unique_ptr<UringIoEngine>> UringIoEngine::Create(const IoEngineOptions& options) {
  RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  std::unique_ptr<UringIoEngine> engine(new UringIoEngine(options));
  unsigned entries = 1;
  while (entries < static_cast<unsigned>(options.io_inflight_max)) entries <<= 1;
  io_uring_params params = {};
  // Room for every read in flight twice over, so completions never overflow.
  params.flags = IORING_SETUP_CQSIZE;
  params.cq_entries = entries * 2;
  const int rc = io_uring_queue_init_params(entries, engine->ring_.get(), &params);
  if (rc < 0) {
    const int err = -rc;
    const std::string what = absl::StrCat("io_uring_setup(", entries, " entries) failed: ", ErrnoName(err));
    if (err == ENOSYS || err == EPERM || err == EACCES || err == EINVAL) {
      return absl::UnavailableError(
          absl::StrCat(what,
                       "; io_uring is not available here (old kernel, kernel.io_uring_disabled, or a "
                       "container's seccomp profile); use the pread engine"));
    }
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, "; the ring counts against RLIMIT_MEMLOCK on older kernels"));
    }
    return absl::Status(absl::ErrnoToStatusCode(err), what);
  }
  engine->ring_ready_ = true;
  io_uring_probe* probe = io_uring_get_probe_ring(engine->ring_.get());
  if (probe == nullptr) {
    return absl::UnavailableError(
        "io_uring: IORING_REGISTER_PROBE failed (kernel older than 5.6?); use the pread engine");
  }
  const bool read = io_uring_opcode_supported(probe, IORING_OP_READ);
  const bool read_fixed = io_uring_opcode_supported(probe, IORING_OP_READ_FIXED);
  io_uring_free_probe(probe);
  if (!read || !read_fixed) {
    return absl::UnavailableError(
        "io_uring: IORING_OP_READ or IORING_OP_READ_FIXED unsupported (kernel older than 5.6?); "
        "use the pread engine");
  }
  return engine;
}

UringIoEngine::~UringIoEngine() {
  if (!ring_ready_) return;
  DrainForShutdown(absl::Seconds(30));
  io_uring_queue_exit(ring_.get());
}

absl::Status UringIoEngine::StartOps(absl::Span<const ChunkOp> ops) {
  for (const ChunkOp& op : ops) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
    // In flight <= io_inflight_max <= SQ entries, and every batch is submitted before the next.
    CHECK(sqe != nullptr);
    if (op.buffer_index >= 0) {
      io_uring_prep_read_fixed(sqe, op.fd, op.dest, op.length, op.offset, op.buffer_index);
    } else {
      io_uring_prep_read(sqe, op.fd, op.dest, op.length, op.offset);
    }
    if (op.file_index >= 0) {
      sqe->fd = op.file_index;
      io_uring_sqe_set_flags(sqe, IOSQE_FIXED_FILE);
    }
    io_uring_sqe_set_data64(sqe, op.id);
  }
  size_t submitted = 0;
  int attempts = 0;
  while (submitted < ops.size()) {
    const int rc = io_uring_submit(ring_.get());
    if (rc > 0) {
      submitted += rc;
      continue;
    }
    const int err = rc == 0 ? EAGAIN : -rc;
    if ((err == EAGAIN || err == EBUSY || err == EINTR) && ++attempts < kSubmitAttempts) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      continue;
    }
    return UringError(absl::StrCat("io_uring_submit of ", ops.size() - submitted, " reads").c_str(), err);
  }
  return absl::OkStatus();
}

int UringIoEngine::TakeCompletions(std::vector<ChunkResult>* out) {
  int taken = 0;
  io_uring_cqe* cqes[64];
  while (true) {
    const unsigned n = io_uring_peek_batch_cqe(ring_.get(), cqes, 64);
    for (unsigned i = 0; i < n; ++i) {
      ChunkResult r;
      r.id = io_uring_cqe_get_data64(cqes[i]);
      r.result = cqes[i]->res;
      out->push_back(std::move(r));
    }
    io_uring_cq_advance(ring_.get(), n);
    taken += static_cast<int>(n);
    if (n < 64) return taken;
  }
}

absl::Status UringIoEngine::ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) {
  int got = TakeCompletions(out);
  while (got < min_results) {
    __kernel_timespec ts = {};
    __kernel_timespec* tsp = nullptr;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      const int64_t ns = absl::ToInt64Nanoseconds(left);
      ts.tv_sec = ns / 1000000000;
      ts.tv_nsec = ns % 1000000000;
      tsp = &ts;
    }
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqes(ring_.get(), &cqe, min_results - got, tsp, nullptr);
    if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN) {
      return UringError("io_uring_wait_cqes", -rc);
    }
    got += TakeCompletions(out);
    if (rc == -ETIME) break;
  }
  return absl::OkStatus();
}

absl::Status UringIoEngine::OnRegisterBuffers(absl::Span<const IoBuffer> buffers) {
  if (buffers_registered_) {
    const int rc = io_uring_unregister_buffers(ring_.get());
    if (rc < 0) return UringError("io_uring_unregister_buffers", -rc);
    buffers_registered_ = false;
  }
  if (buffers.empty()) return absl::OkStatus();
  std::vector<iovec> iov(buffers.size());
  uint64_t total = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    iov[i].iov_base = buffers[i].data;
    iov[i].iov_len = buffers[i].size;
    total += buffers[i].size;
  }
  const int rc = io_uring_register_buffers(ring_.get(), iov.data(), iov.size());
  if (rc < 0) {
    const int err = -rc;
    const std::string what =
        absl::StrCat("io_uring_register_buffers of ", buffers.size(), " buffers, ", total, " bytes: ", ErrnoName(err));
    if (err == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what, "; pinning them exceeds RLIMIT_MEMLOCK (ulimit -l; LimitMEMLOCK= in systemd)"));
    }
    if (err == EFAULT || err == EOPNOTSUPP) {
      return absl::InvalidArgumentError(absl::StrCat(what, "; buffers must be anonymous or hugetlbfs memory"));
    }
    return absl::Status(absl::ErrnoToStatusCode(err), what);
  }
  buffers_registered_ = true;
  return absl::OkStatus();
}

absl::Status UringIoEngine::OnRegisterFiles(absl::Span<const int> fds) {
  if (files_registered_) {
    const int rc = io_uring_unregister_files(ring_.get());
    if (rc < 0) return UringError("io_uring_unregister_files", -rc);
    files_registered_ = false;
  }
  if (fds.empty()) return absl::OkStatus();
  const int rc = io_uring_register_files(ring_.get(), fds.data(), fds.size());
  if (rc < 0) {
    return UringError(absl::StrCat("io_uring_register_files of ", fds.size(), " files").c_str(), -rc);
  }
  files_registered_ = true;
  return absl::OkStatus();
}

}  // namespace mer
