#include "services/compute/cpu/thread_pool.h"

#include <algorithm>

#include "common/base/check.h"
#include "common/base/cpu_relax.h"

namespace mer {
namespace {

constexpr int kSpinIterations = 4000;   // pause-spins before yielding
constexpr int kYieldIterations = 2000;  // yields before a worker sleeps

// Waits until `ready()`: spin, then yield so a peer that needs this core can run.
template <typename Ready>
void SpinThenYield(const Ready& ready) {
  for (int i = 0; !ready(); ++i) {
    if (i < kSpinIterations) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

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

void ThreadPool::RunChunks(uint32_t generation, int thread) {
  const Job& job = jobs_[generation & 1];
  const Invoke invoke = job.invoke.load(std::memory_order_acquire);
  const void* ctx = job.ctx.load(std::memory_order_acquire);
  const int64_t n = job.n.load(std::memory_order_acquire);
  const int64_t grain = job.grain.load(std::memory_order_acquire);
  uint64_t word = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (static_cast<uint32_t>(word >> 32) != generation) return;  // a newer job: fields are stale
    const int64_t begin = static_cast<int64_t>(word & 0xffffffffu);
    if (begin >= n) return;
    const int64_t end = std::min(begin + grain, n);
    if (!claim_.compare_exchange_weak(word, (word & ~uint64_t{0xffffffffu}) | uint64_t(end), std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;  // `word` was reloaded
    invoke(ctx, begin, end, thread);
    done_.fetch_add(end - begin, std::memory_order_release);
    word = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::Run(int64_t n, int64_t grain, Invoke invoke, const void* ctx) {
  CHECK(n < (int64_t{1} << 31));
  const uint32_t generation = generation_.load(std::memory_order_relaxed) + 1;
  Job& job = jobs_[generation & 1];
  job.invoke.store(invoke, std::memory_order_release);
  job.ctx.store(ctx, std::memory_order_release);
  job.n.store(n, std::memory_order_release);
  job.grain.store(grain, std::memory_order_release);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(uint64_t{generation} << 32, std::memory_order_release);
  generation_.store(generation, std::memory_order_release);
  generation_.notify_all();
  RunChunks(generation, 0);
  SpinThenYield([&] { return done_.load(std::memory_order_acquire) == n; });
}

void ThreadPool::WorkerLoop(int thread) {
  uint32_t seen = 0;  // not a load: a job may have been published before this thread ran
  for (;;) {
    uint32_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; now == seen && i < kSpinIterations + kYieldIterations; ++i) {
      if (i < kSpinIterations) {
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
    RunChunks(now, thread);
  }
}

}  // namespace mer
