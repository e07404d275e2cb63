#include "common/io/pread_io_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>

#include "common/base/status.h"

namespace mer {

PreadIoEngine::PreadIoEngine(const IoEngineOptions& options) : ChunkingIoEngine(options) {}

absl::StatusOr<std::unique_ptr<PreadIoEngine>> PreadIoEngine::Create(const IoEngineOptions& options) {
  RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  std::unique_ptr<PreadIoEngine> engine(new PreadIoEngine(options));
  const int threads = options.pread_threads > 0 ? std::min(options.pread_threads, options.io_inflight_max)
                                                : std::min(options.io_inflight_max, 8);
  engine->workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) engine->workers_.emplace_back([e = engine.get()] { e->Work(); });
  return engine;
}

PreadIoEngine::~PreadIoEngine() {
  DrainForShutdown(absl::Seconds(30));
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

absl::Status PreadIoEngine::StartOps(absl::Span<const ChunkOp> ops) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.insert(queue_.end(), ops.begin(), ops.end());
  }
  if (ops.size() == 1) {
    work_cv_.notify_one();
  } else {
    work_cv_.notify_all();
  }
  return absl::OkStatus();
}

void PreadIoEngine::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    const ChunkOp op = queue_.front();
    queue_.pop_front();
    lock.unlock();
    ssize_t n;
    do {
      n = pread(op.fd, op.dest, op.length, static_cast<off_t>(op.offset));
    } while (n < 0 && errno == EINTR);
    ChunkResult r;
    r.id = op.id;
    r.result = n >= 0 ? static_cast<int64_t>(n) : -static_cast<int64_t>(errno);
    lock.lock();
    done_.push_back(std::move(r));
    done_cv_.notify_one();
  }
}

absl::Status PreadIoEngine::ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) {
  std::unique_lock<std::mutex> lock(mu_);
  auto enough = [&] { return static_cast<int>(done_.size()) >= min_results; };
  if (!enough()) {
    if (deadline == absl::InfiniteFuture()) {
      done_cv_.wait(lock, enough);
    } else {
      done_cv_.wait_until(lock, absl::ToChronoTime(deadline), enough);
    }
  }
  for (ChunkResult& r : done_) out->push_back(std::move(r));
  done_.clear();
  return absl::OkStatus();
}

}  // namespace mer
