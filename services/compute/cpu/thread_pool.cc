#include "services/compute/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace mer {
namespace {
inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}
constexpr int kSpinIterations = 20000;  // ~100 us of pause before a worker sleeps
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(int thread) {
  for (;;) {
    const int64_t begin = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (begin >= n_) return;
    invoke_(ctx_, begin, std::min(begin + grain_, n_), thread);
  }
}

void ThreadPool::Run(int64_t n, int64_t grain, Invoke invoke, const void* ctx) {
  invoke_ = invoke;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  RunChunks(0);
  // Wait for the workers to leave the job; they are at most one chunk behind. Yield after a short
  // spin: with more threads than free cores the worker we wait for may need our core.
  for (int i = 0; busy_.load(std::memory_order_acquire) != 0; ++i) {
    if (i < kSpinIterations / 8) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop(int thread) {
  // Not a load: a job may already have been published before this thread got to run.
  uint64_t seen = 0;
  for (;;) {
    uint64_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; now == seen && i < kSpinIterations; ++i) {
      if (i < kSpinIterations / 8) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
      now = generation_.load(std::memory_order_acquire);
    }
    while (now == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_relaxed)) return;
    RunChunks(thread);
    busy_.fetch_sub(1, std::memory_order_release);
  }
}

}  // namespace mer
