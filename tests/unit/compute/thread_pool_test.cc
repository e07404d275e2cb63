#include "services/compute/cpu/thread_pool.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace mer
