// A fixed pool of worker threads for data-parallel loops in the decode step.
//
// ParallelFor hands out [begin, end) chunks through one atomic counter; the calling thread works
// too. Workers spin briefly between jobs (a decode step issues a few hundred loops, microseconds
// apart) and then sleep on an atomic wait. No allocation and no lock per loop.
//
// Thread-safety: ParallelFor must be called from one thread at a time (the engine's step thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace mer {

class ThreadPool {
 public:
  // `threads` in total, the caller included; 1 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of at most `grain`; returns when all are done.
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, const Fn& fn) {
    ParallelForIndexed(n, grain, [&fn](int64_t b, int64_t e, int) { fn(b, e); });
  }

  // Same, and tells fn which thread runs the chunk (0 = caller, < threads()), for per-thread scratch.
  template <typename Fn>
  void ParallelForIndexed(int64_t n, int64_t grain, const Fn& fn) {
    if (n <= 0) return;
    if (workers_.empty() || n <= grain) {
      fn(int64_t{0}, n, 0);
      return;
    }
    Run(n, grain,
        [](const void* ctx, int64_t b, int64_t e, int thread) {
          (*static_cast<const Fn*>(ctx))(b, e, thread);
        },
        &fn);
  }

 private:
  using Invoke = void (*)(const void* ctx, int64_t begin, int64_t end, int thread);
  void Run(int64_t n, int64_t grain, Invoke invoke, const void* ctx);
  void WorkerLoop(int thread);
  void RunChunks(int thread);

  std::vector<std::thread> workers_;
  // The current job; written by the caller before generation_ is released, read by workers after
  // they acquire it.
  Invoke invoke_ = nullptr;
  const void* ctx_ = nullptr;
  int64_t n_ = 0;
  int64_t grain_ = 1;
  std::atomic<int64_t> next_{0};      // next chunk start
  std::atomic<int> busy_{0};          // workers still inside the current job
  std::atomic<uint64_t> generation_{0};  // bumped (release) per job; workers acquire it
  std::atomic<bool> stop_{false};
};

}  // namespace mer
