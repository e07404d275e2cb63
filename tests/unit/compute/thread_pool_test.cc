#include "services/compute/cpu/thread_pool.h"

#include <gtest/gtest.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <atomic>
#include <vector>

namespace mer {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 1000, 12345}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, 13, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << i;
    }
  }
}

TEST(ThreadPool, ThreadIndexInRangeAndManyJobsInARow) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job) {
    pool.ParallelForIndexed(64, 4, [&](int64_t b, int64_t e, int thread) {
      ASSERT_GE(thread, 0);
      ASSERT_LT(thread, 3);
      sum.fetch_add(e - b);
    });
  }
  EXPECT_EQ(sum.load(), 20000 * 64);
}

// Many small jobs of changing sizes on more threads than cores, so that workers are descheduled
// between seeing a job and reading it: a late worker must never run a chunk of the next job with
// the fields of another (each job writes its own buffer; a chunk run twice, lost or run with the
// wrong job shows in the counts) nor count into the next job's progress (the caller would then
// wait forever). A watchdog turns a deadlock into a failure.
TEST(ThreadPool, OversubscribedJobsOfChangingSizeNeitherMixNorDeadlock) {
  ThreadPool pool(8);
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 300 && !finished.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!finished.load()) {
      std::fprintf(stderr, "ThreadPool deadlocked: a job never finished\n");
      std::abort();
    }
  });
  const int64_t sizes[] = {3, 8, 1, 50, 2, 8, 17};
  std::vector<int> a(64), b(64);
  for (int job = 0; job < 100000; ++job) {
    const int64_t n = sizes[job % 7];
    std::vector<int>& buf = (job & 1) ? a : b;
    std::fill(buf.begin(), buf.begin() + n, 0);
    const int tag = job;
    pool.ParallelFor(n, 1, [&buf, tag](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) buf[i] += tag + 1;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], tag + 1) << "job " << job << " index " << i;
  }
  finished = true;
  watchdog.join();
}

}  // namespace
}  // namespace mer
