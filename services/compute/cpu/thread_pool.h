// A fixed pool of worker threads for data-parallel loops in the decode step.
//
// ParallelFor publishes a job and works on it too; it returns when every chunk is done, not when
// every worker has checked in, so a worker that the OS has not scheduled yet (other processes on
// the cores) never delays a loop it took no part in. Workers spin briefly between jobs (a decode
// step issues a few hundred loops, microseconds apart), then yield, then sleep on an atomic wait.
// No allocation and no lock per loop.
//
// Invariants. `claim_` packs (job generation << 32 | next chunk start): a chunk is claimed by a
// compare-exchange that also checks the generation, so a late worker can never claim a chunk of a
// job other than the one it read. A job's fields live in jobs_[generation & 1] and are written
// before the generation is released: a worker that saw generation g reads slot g & 1, which the
// caller rewrites only for job g + 2, i.e. after job g + 1 has finished, which needs job g
// finished first. So whenever its claim on (g, begin) succeeds, job g is unfinished and the fields
// it read are job g's (the fields are stored with release and loaded with acquire: a worker that
// read a field of job g + 2 has thereby seen claim_ move past job g, so its claim fails). (With a single set of fields, a worker descheduled between seeing job g and
// reading its fields could read job g + 1's size while claim_ still showed job g's last chunk,
// claim a chunk that did not exist and count it into job g + 1's progress: the caller then waited
// forever. The oversubscribed test in thread_pool_test.cc found that.) `done_` counts finished items
// of the current job; the caller returns once it reaches n, so every claimed chunk has finished
// before the next job is published.
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
    Run(
        n, grain,
        [](const void* ctx, int64_t b, int64_t e, int thread) { (*static_cast<const Fn*>(ctx))(b, e, thread); }, &fn);
  }

 private:
  using Invoke = void (*)(const void* ctx, int64_t begin, int64_t end, int thread);
  void Run(int64_t n, int64_t grain, Invoke invoke, const void* ctx);
  void WorkerLoop(int thread);
  // Runs chunks of job `generation` until none is left or a newer job replaced it.
  void RunChunks(uint32_t generation, int thread);

  std::vector<std::thread> workers_;
  // A job (release/acquire atomics: see the invariants above); job g lives in jobs_[g & 1].
  struct Job {
    std::atomic<Invoke> invoke{nullptr};
    std::atomic<const void*> ctx{nullptr};
    std::atomic<int64_t> n{0};
    std::atomic<int64_t> grain{1};
  };
  Job jobs_[2];
  std::atomic<uint64_t> claim_{0};       // generation << 32 | next chunk start
  std::atomic<int64_t> done_{0};         // items of the current job finished
  std::atomic<uint32_t> generation_{0};  // bumped (release) per job; workers acquire it
  std::atomic<bool> stop_{false};
};

}  // namespace mer
