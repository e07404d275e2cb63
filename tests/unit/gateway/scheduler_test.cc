#include "services/gateway/scheduler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace mer::gateway {
namespace {

const absl::Time kNever = absl::InfiniteFuture();

// Waits until `n` calls are queued.
void WaitForWaiting(const Scheduler& s, int n) {
  for (int i = 0; i < 5000 && s.waiting() < n; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(s.waiting(), n);
}

TEST(SchedulerTest, UnavailableUntilCapacityIsKnown) {
  Scheduler s({});
  EXPECT_EQ(s.Admit(0, 10, kNever, nullptr).code(), absl::StatusCode::kUnavailable);
  s.SetCapacity(2, 100);
  EXPECT_TRUE(s.Admit(0, 10, kNever, nullptr).ok());
  EXPECT_EQ(s.running(), 1);
  s.Release(10);
  EXPECT_EQ(s.running(), 0);
}

TEST(SchedulerTest, AdmitsByPriorityThenArrival) {
  Scheduler s({});
  s.SetCapacity(1, 1000);
  ASSERT_TRUE(s.Admit(0, 1, kNever, nullptr).ok());  // the one slot is taken
  std::mutex mu;
  std::vector<int> order;
  std::vector<std::thread> threads;
  const int priorities[] = {0, 5, 0, 9, 5};
  for (int i = 0; i < 5; ++i) {
    threads.emplace_back([&, i] {
      ASSERT_TRUE(s.Admit(priorities[i], 1, kNever, nullptr).ok());
      {
        std::lock_guard<std::mutex> lock(mu);
        order.push_back(i);
      }
      s.Release(1);
    });
    WaitForWaiting(s, i + 1);  // arrival order is the index
  }
  s.Release(1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(order, (std::vector<int>{3, 1, 4, 0, 2}));
}

TEST(SchedulerTest, FullQueueIsResourceExhausted) {
  SchedulerOptions o;
  o.max_queue = 2;
  Scheduler s(o);
  s.SetCapacity(1, 1000);
  ASSERT_TRUE(s.Admit(0, 1, kNever, nullptr).ok());
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      EXPECT_TRUE(s.Admit(0, 1, kNever, nullptr).ok());
      s.Release(1);
    });
  }
  WaitForWaiting(s, 2);
  const absl::Status full = s.Admit(0, 1, kNever, nullptr);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  s.Release(1);
  for (auto& t : threads) t.join();
}

TEST(SchedulerTest, NoQueueStillAdmitsWhatFits) {
  SchedulerOptions o;
  o.max_queue = 0;
  Scheduler s(o);
  s.SetCapacity(1, 10);
  EXPECT_TRUE(s.Admit(0, 5, kNever, nullptr).ok());
  EXPECT_EQ(s.Admit(0, 5, kNever, nullptr).code(), absl::StatusCode::kResourceExhausted);
  s.Release(5);
  EXPECT_TRUE(s.Admit(0, 5, kNever, nullptr).ok());
}

TEST(SchedulerTest, KvBudgetHoldsTheHeadAndNothingOvertakesIt) {
  Scheduler s({});
  s.SetCapacity(4, 100);
  ASSERT_TRUE(s.Admit(0, 60, kNever, nullptr).ok());
  std::atomic<bool> big_in{false}, small_in{false};
  std::thread big([&] {
    ASSERT_TRUE(s.Admit(0, 50, kNever, nullptr).ok());  // 60 + 50 > 100: waits
    big_in = true;
  });
  WaitForWaiting(s, 1);
  std::thread small([&] {
    ASSERT_TRUE(s.Admit(0, 10, kNever, nullptr).ok());  // would fit, but the head waits first
    small_in = true;
  });
  WaitForWaiting(s, 2);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(big_in);
  EXPECT_FALSE(small_in);
  s.Release(60);
  big.join();
  small.join();
  EXPECT_EQ(s.running(), 2);
}

TEST(SchedulerTest, DeadlineCancelAndComputeLoss) {
  Scheduler s({});
  s.SetCapacity(1, 100);
  ASSERT_TRUE(s.Admit(0, 1, kNever, nullptr).ok());
  EXPECT_EQ(s.Admit(0, 1, absl::Now() + absl::Milliseconds(20), nullptr).code(), absl::StatusCode::kDeadlineExceeded);
  std::atomic<bool> cancel{false};
  std::thread t([&] { EXPECT_EQ(s.Admit(0, 1, kNever, &cancel).code(), absl::StatusCode::kCancelled); });
  WaitForWaiting(s, 1);
  cancel = true;
  s.Poke();
  t.join();
  std::thread u([&] { EXPECT_EQ(s.Admit(0, 1, kNever, nullptr).code(), absl::StatusCode::kUnavailable); });
  WaitForWaiting(s, 1);
  s.SetUnavailable();
  u.join();
  EXPECT_EQ(s.waiting(), 0);
}

}  // namespace
}  // namespace mer::gateway
