#include "common/io/chunking_io_engine.h"

#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"

namespace mer {
namespace {

// EINTR/EAGAIN resubmissions of one chunk before it counts as failed.
constexpr int kMaxRetries = 8;
constexpr uint64_t kMaxRegisteredBuffer = uint64_t{1} << 30;  // the kernel's limit per buffer
constexpr size_t kMaxRegisteredBuffers = 16384;               // IORING_MAX_REG_BUFFERS

absl::Status ReadErrnoStatus(int err, const std::string& message) {
  switch (err) {
    case EIO:
    case ENODATA:  // newer kernels' "critical medium error"
      return absl::DataLossError(message);
    case EINVAL:
      return absl::InvalidArgumentError(absl::StrCat(message,
                                                     " (with O_DIRECT, offset, length and destination must be aligned "
                                                     "to the logical block size)"));
    default:
      return absl::Status(absl::ErrnoToStatusCode(err), message);
  }
}

}  // namespace

ChunkingIoEngine::ChunkingIoEngine(const IoEngineOptions& options)
    : options_(options), slots_(options.io_inflight_max) {
  CHECK(ValidateIoEngineOptions(options).ok());
  free_slots_.reserve(options.io_inflight_max);
  for (int i = options.io_inflight_max - 1; i >= 0; --i) free_slots_.push_back(i);
  op_scratch_.reserve(options.io_inflight_max);
  result_scratch_.reserve(options.io_inflight_max);
}

absl::StatusOr<uint64_t> ChunkingIoEngine::FileSize(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::Status(absl::ErrnoToStatusCode(errno), absl::StrCat("fstat of fd ", fd, ": ", ErrnoName(errno)));
  }
  if (S_ISBLK(st.st_mode)) {
    uint64_t bytes = 0;
    if (ioctl(fd, BLKGETSIZE64, &bytes) != 0) {
      return absl::Status(absl::ErrnoToStatusCode(errno),
                          absl::StrCat("BLKGETSIZE64 of fd ", fd, ": ", ErrnoName(errno)));
    }
    return bytes;
  }
  return static_cast<uint64_t>(st.st_size);
}

absl::Status ChunkingIoEngine::RegisterBuffers(absl::Span<const IoBuffer> buffers) {
  RETURN_IF_ERROR(broken_);
  if (inflight_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat("RegisterBuffers with ", inflight_, " reads in flight"));
  }
  if (buffers.size() > kMaxRegisteredBuffers) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterBuffers: ", buffers.size(), " buffers, at most ", kMaxRegisteredBuffers));
  }
  std::vector<Registered> sorted;
  sorted.reserve(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].data == nullptr || buffers[i].size == 0 || buffers[i].size > kMaxRegisteredBuffer) {
      return absl::InvalidArgumentError(absl::StrCat("RegisterBuffers: buffer ", i, " of ", buffers[i].size,
                                                     " bytes (must be non-null, 1 byte .. 1 GiB)"));
    }
    const auto begin = reinterpret_cast<uintptr_t>(buffers[i].data);
    sorted.push_back({begin, begin + buffers[i].size, static_cast<int>(i)});
  }
  std::sort(sorted.begin(), sorted.end(), [](const Registered& a, const Registered& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].begin < sorted[i - 1].end) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterBuffers: buffers ", sorted[i - 1].index, " and ", sorted[i].index, " overlap"));
    }
  }
  buffers_.clear();  // reads queued meanwhile must not name a stale registration
  RETURN_IF_ERROR(OnRegisterBuffers(buffers));
  buffers_ = std::move(sorted);
  return absl::OkStatus();
}

absl::Status ChunkingIoEngine::RegisterFiles(absl::Span<const int> fds) {
  RETURN_IF_ERROR(broken_);
  if (inflight_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat("RegisterFiles with ", inflight_, " reads in flight"));
  }
  std::unordered_map<int, int> index;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (fds[i] < 0 || !index.emplace(fds[i], static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterFiles: fd ", fds[i], " at ", i, " is negative or repeated"));
    }
  }
  file_index_.clear();
  RETURN_IF_ERROR(OnRegisterFiles(fds));
  file_index_ = std::move(index);
  return absl::OkStatus();
}

absl::Status ChunkingIoEngine::Submit(absl::Span<const ReadRequest> requests) {
  RETURN_IF_ERROR(broken_);
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& q = requests[i];
    if (q.fd < 0 || q.dest == nullptr || q.length == 0 || q.offset + q.length < q.offset) {
      return absl::InvalidArgumentError(absl::StrCat("Submit: request ", i, " (fd ", q.fd, ", offset ", q.offset,
                                                     ", length ", q.length, ", tag ", q.tag,
                                                     ") needs fd >= 0, a destination and a length > 0"));
    }
  }
  for (const ReadRequest& q : requests) {
    uint32_t id;
    if (free_requests_.empty()) {
      id = static_cast<uint32_t>(requests_.size());
      requests_.emplace_back();
    } else {
      id = free_requests_.back();
      free_requests_.pop_back();
    }
    Request& r = requests_[id];
    r.tag = q.tag;
    r.fd = q.fd;
    r.offset = q.offset;
    r.length = q.length;
    r.status = absl::OkStatus();
    r.chunks_left = 0;
    auto* dest = static_cast<uint8_t*>(q.dest);
    for (uint64_t done = 0; done < q.length; done += options_.chunk_bytes) {
      const uint64_t n = std::min(options_.chunk_bytes, q.length - done);
      queued_.push_back({id, q.offset + done, n, dest + done, 0});
      ++r.chunks_left;
    }
  }
  outstanding_ += requests.size();
  stats_.requests_submitted += requests.size();
  return Pump();
}

absl::Status ChunkingIoEngine::Pump() {
  RETURN_IF_ERROR(broken_);
  op_scratch_.clear();
  while (!queued_.empty() && !free_slots_.empty()) {
    const Chunk c = queued_.front();
    queued_.pop_front();
    const uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = c;
    ChunkOp op;
    op.id = slot;
    op.fd = requests_[c.request].fd;
    op.offset = c.offset;
    op.length = static_cast<uint32_t>(c.length);
    op.dest = c.dest;
    op.buffer_index = BufferIndex(c.dest, c.length);
    if (!file_index_.empty()) {
      auto it = file_index_.find(op.fd);
      if (it != file_index_.end()) op.file_index = it->second;
    }
    stats_.fixed_buffer_chunks += op.buffer_index >= 0;
    stats_.fixed_file_chunks += op.file_index >= 0;
    op_scratch_.push_back(op);
  }
  if (op_scratch_.empty()) return absl::OkStatus();
  inflight_ += static_cast<int>(op_scratch_.size());
  stats_.chunks_issued += op_scratch_.size();
  stats_.max_inflight = std::max(stats_.max_inflight, inflight_);
  absl::Status status = StartOps(op_scratch_);
  if (!status.ok()) broken_ = status;
  return status;
}

absl::StatusOr<int> ChunkingIoEngine::Wait(int min_completions, absl::Duration timeout,
                                           std::vector<ReadCompletion>* out) {
  RETURN_IF_ERROR(broken_);
  if (min_completions < 0) return absl::InvalidArgumentError("Wait: min_completions < 0");
  const absl::Time deadline = absl::Now() + timeout;
  const int64_t target = std::min<int64_t>(min_completions, outstanding_);
  int returned = 0;
  auto take_ready = [&] {
    for (ReadCompletion& c : ready_) out->push_back(std::move(c));
    returned += static_cast<int>(ready_.size());
    outstanding_ -= static_cast<int64_t>(ready_.size());
    ready_.clear();
  };
  take_ready();
  while (true) {
    RETURN_IF_ERROR(Pump());
    if (inflight_ == 0) {
      // Every slot is free, so nothing is queued: all outstanding requests were returned.
      CHECK(returned >= target);
      break;
    }
    const bool need = returned < target;
    result_scratch_.clear();
    absl::Status status = ReapOps(need ? 1 : 0, need ? deadline : absl::InfinitePast(), &result_scratch_);
    if (!status.ok()) {
      broken_ = status;
      return status;
    }
    for (const ChunkResult& r : result_scratch_) Process(r);
    take_ready();
    if (!need) break;  // that was the last, non-blocking look after reaching the target
    if (absl::Now() >= deadline) break;
  }
  RETURN_IF_ERROR(Pump());  // continuations and retries found in the last look
  return returned;
}

void ChunkingIoEngine::Process(const ChunkResult& result) {
  CHECK(result.id < slots_.size());
  Chunk c = slots_[result.id];
  free_slots_.push_back(static_cast<uint32_t>(result.id));
  --inflight_;
  Request& r = requests_[c.request];
  if (!r.status.ok()) {  // the request already failed; its completion waits for this chunk
    FinishChunk(c.request);
    return;
  }
  if (!result.status.ok()) {  // from an engine below: keep its code, add the request
    Fail(c.request, absl::Status(result.status.code(), absl::StrCat(Describe(r, c), ": ", result.status.message())));
    FinishChunk(c.request);
    return;
  }
  const int64_t n = result.result;
  if (n < 0) {
    const int err = static_cast<int>(-n);
    if ((err == EINTR || err == EAGAIN) && c.retries < kMaxRetries) {
      ++c.retries;
      ++stats_.retries;
      queued_.push_front(c);
      return;
    }
    Fail(c.request, ReadErrnoStatus(err, absl::StrCat(Describe(r, c), ": ", ErrnoName(err))));
    FinishChunk(c.request);
    return;
  }
  if (static_cast<uint64_t>(n) > c.length) {
    Fail(c.request, absl::InternalError(absl::StrCat(Describe(r, c), ": the OS returned ", n, " bytes")));
    FinishChunk(c.request);
    return;
  }
  stats_.bytes_read += n;
  if (static_cast<uint64_t>(n) == c.length) {
    FinishChunk(c.request);
    return;
  }
  // Short read: end of file, or continue with the rest.
  const uint64_t end = c.offset + n;
  absl::StatusOr<uint64_t> size = n == 0 ? absl::StatusOr<uint64_t>(end) : FileSize(r.fd);
  if (n == 0 || (size.ok() && end >= *size)) {
    Fail(c.request,
         absl::OutOfRangeError(absl::StrCat("read of ", r.length, " bytes at offset ", r.offset, " (fd ", r.fd,
                                            ", tag ", r.tag, "): end of file at offset ", end,
                                            size.ok() && n != 0 ? absl::StrCat(" (file size ", *size, ")") : "")));
    FinishChunk(c.request);
    return;
  }
  ++stats_.short_reads;
  c.offset += n;
  c.dest += n;
  c.length -= n;
  c.retries = 0;
  queued_.push_front(c);
}

void ChunkingIoEngine::Fail(uint32_t request, absl::Status status) {
  Request& r = requests_[request];
  if (r.status.ok()) r.status = std::move(status);
  // Drop the request's chunks not yet issued. The caller's FinishChunk (for the chunk that
  // failed) keeps chunks_left above zero here.
  const size_t before = queued_.size();
  queued_.erase(
      std::remove_if(queued_.begin(), queued_.end(), [request](const Chunk& c) { return c.request == request; }),
      queued_.end());
  r.chunks_left -= static_cast<int>(before - queued_.size());
  CHECK(r.chunks_left >= 1);
}

void ChunkingIoEngine::FinishChunk(uint32_t request) {
  Request& r = requests_[request];
  if (--r.chunks_left > 0) return;
  ReadCompletion done;
  done.tag = r.tag;
  done.bytes = r.status.ok() ? r.length : 0;
  ++stats_.requests_completed;
  stats_.requests_failed += !r.status.ok();
  done.status = std::move(r.status);
  r.status = absl::OkStatus();
  ready_.push_back(std::move(done));
  free_requests_.push_back(request);
}

int ChunkingIoEngine::BufferIndex(const uint8_t* dest, uint64_t length) const {
  if (buffers_.empty()) return -1;
  const auto begin = reinterpret_cast<uintptr_t>(dest);
  auto it = std::upper_bound(buffers_.begin(), buffers_.end(), begin,
                             [](uintptr_t v, const Registered& b) { return v < b.begin; });
  if (it == buffers_.begin()) return -1;
  --it;
  return begin + length <= it->end ? it->index : -1;
}

std::string ChunkingIoEngine::Describe(const Request& r, const Chunk& c) const {
  return absl::StrCat("read of ", r.length, " bytes at offset ", r.offset, " (fd ", r.fd, ", tag ", r.tag,
                      "): ", c.length, " bytes at file offset ", c.offset);
}

void ChunkingIoEngine::DrainForShutdown(absl::Duration timeout) {
  // A broken engine may hold ops that were never issued; don't wait long for those.
  const absl::Time deadline = absl::Now() + (broken_.ok() ? timeout : absl::Seconds(1));
  queued_.clear();
  while (inflight_ > 0 && absl::Now() < deadline) {
    result_scratch_.clear();
    if (!ReapOps(1, deadline, &result_scratch_).ok()) break;
    for (const ChunkResult& r : result_scratch_) {
      free_slots_.push_back(static_cast<uint32_t>(r.id));
      --inflight_;
    }
  }
}

}  // namespace mer
