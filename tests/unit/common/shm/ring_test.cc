// Single-process tests of the SPSC ring: empty/full, wraparound, batches, restarts of either side,
// corrupt counters, and the futex wake-ups between two threads.
#include "common/shm/ring.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mer::shm {
namespace {

struct Msg {
  uint64_t seq;
  uint64_t check;
};
uint64_t Check(uint64_t seq) { return seq * 0x9e3779b97f4a7c15ULL ^ 0x5555; }
Msg Make(uint64_t seq) { return Msg{seq, Check(seq)}; }

// A ring in ordinary memory, laid out as in the segment.
class LocalRing {
 public:
  explicit LocalRing(uint32_t capacity)
      : bytes_(static_cast<uint8_t*>(std::aligned_alloc(64, RingRegionBytes(capacity, sizeof(Msg))))) {
    new (bytes_) RingControl();
    region_.control = reinterpret_cast<RingControl*>(bytes_);
    region_.slots = reinterpret_cast<Msg*>(bytes_ + sizeof(RingControl));
    region_.capacity = capacity;
  }
  ~LocalRing() { std::free(bytes_); }
  const RingRegion<Msg>& region() const { return region_; }
  RingControl& control() { return *region_.control; }

 private:
  uint8_t* bytes_;
  RingRegion<Msg> region_;
};

TEST(RingTest, EmptyAndFull) {
  LocalRing ring(8);
  RingProducer<Msg> p(ring.region());
  RingConsumer<Msg> c(ring.region());
  Msg m;
  EXPECT_FALSE(c.TryPop(&m));
  for (uint64_t i = 0; i < 8; ++i) EXPECT_TRUE(p.TryPush(Make(i))) << i;
  EXPECT_FALSE(p.TryPush(Make(8)));
  EXPECT_EQ(p.SizeApprox(), 8u);
  EXPECT_EQ(c.SizeApprox(), 8u);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(c.TryPop(&m));
    EXPECT_EQ(m.seq, i);
    EXPECT_EQ(m.check, Check(i));
  }
  EXPECT_FALSE(c.TryPop(&m));
  EXPECT_TRUE(p.TryPush(Make(8)));  // space again
  EXPECT_FALSE(p.corrupted());
  EXPECT_FALSE(c.corrupted());
}

TEST(RingTest, WraparoundKeepsOrder) {
  LocalRing ring(4);
  RingProducer<Msg> p(ring.region());
  RingConsumer<Msg> c(ring.region());
  uint64_t next_push = 0, next_pop = 0;
  std::vector<Msg> in, out(3);
  for (int round = 0; round < 10000; ++round) {
    const size_t want = 1 + round % 5;  // 1..5: sometimes more than fits
    in.clear();
    for (size_t i = 0; i < want; ++i) in.push_back(Make(next_push + i));
    const size_t pushed = p.TryPushBatch(in);
    EXPECT_LE(pushed, 4u);
    next_push += pushed;
    const size_t popped = c.PopBatch(absl::MakeSpan(out).subspan(0, 1 + round % 3));
    for (size_t i = 0; i < popped; ++i) {
      ASSERT_EQ(out[i].seq, next_pop) << "round " << round;
      ASSERT_EQ(out[i].check, Check(next_pop));
      ++next_pop;
    }
  }
  Msg m;
  while (c.TryPop(&m)) {
    ASSERT_EQ(m.seq, next_pop++);
  }
  EXPECT_EQ(next_pop, next_push);
  EXPECT_GT(next_push, 4u * 1000);  // wrapped many times
  EXPECT_EQ(ring.control().head.load(), next_push);
  EXPECT_EQ(ring.control().tail.load(), next_pop);
}

TEST(RingTest, BatchPushTakesWhatFitsAndBatchPopTakesWhatIsThere) {
  LocalRing ring(8);
  RingProducer<Msg> p(ring.region());
  RingConsumer<Msg> c(ring.region());
  std::vector<Msg> in;
  for (uint64_t i = 0; i < 10; ++i) in.push_back(Make(i));
  EXPECT_EQ(p.TryPushBatch(in), 8u);
  EXPECT_EQ(p.TryPushBatch(absl::MakeConstSpan(in).subspan(8)), 0u);
  std::vector<Msg> out(5);
  EXPECT_EQ(c.PopBatch(absl::MakeSpan(out)), 5u);
  EXPECT_EQ(out[4].seq, 4u);
  EXPECT_EQ(p.TryPushBatch(absl::MakeConstSpan(in).subspan(8)), 2u);
  std::vector<Msg> rest(16);
  EXPECT_EQ(c.PopBatch(absl::MakeSpan(rest)), 5u);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(rest[i].seq, 5 + i);
  EXPECT_EQ(c.PopBatch(absl::MakeSpan(rest)), 0u);
  EXPECT_EQ(p.TryPushBatch({}), 0u);
  EXPECT_EQ(c.PopBatch({}), 0u);
}

TEST(RingTest, RestartedProducerAndConsumerContinueFromSharedCounters) {
  LocalRing ring(16);
  {
    RingProducer<Msg> p(ring.region());
    for (uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(p.TryPush(Make(i)));
  }
  {
    RingConsumer<Msg> c(ring.region());
    Msg m;
    for (uint64_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(c.TryPop(&m));
      EXPECT_EQ(m.seq, i);
    }
  }
  // Both sides "restart": new objects, state only from shared memory.
  RingProducer<Msg> p(ring.region());
  RingConsumer<Msg> c(ring.region());
  EXPECT_EQ(p.pushed(), 10u);
  EXPECT_EQ(c.popped(), 4u);
  for (uint64_t i = 10; i < 20; ++i) ASSERT_TRUE(p.TryPush(Make(i)));
  EXPECT_FALSE(p.TryPush(Make(20)));  // 16 in flight
  Msg m;
  for (uint64_t i = 4; i < 20; ++i) {
    ASSERT_TRUE(c.TryPop(&m));
    EXPECT_EQ(m.seq, i);
  }
}

TEST(RingTest, CorruptCountersAreReportedNotFollowed) {
  LocalRing ring(8);
  ring.control().head.store(100);
  ring.control().tail.store(50);  // 50 "items" in an 8-slot ring
  RingConsumer<Msg> c(ring.region());
  std::vector<Msg> out(8);
  EXPECT_EQ(c.PopBatch(absl::MakeSpan(out)), 0u);
  EXPECT_TRUE(c.corrupted());
  RingProducer<Msg> p(ring.region());
  EXPECT_FALSE(p.TryPush(Make(0)));
  EXPECT_TRUE(p.corrupted());

  LocalRing ring2(8);
  ring2.control().head.store(3);
  ring2.control().tail.store(7);  // tail ahead of head
  RingConsumer<Msg> c2(ring2.region());
  EXPECT_EQ(c2.PopBatch(absl::MakeSpan(out)), 0u);
  EXPECT_TRUE(c2.corrupted());
}

TEST(RingTest, WaitTimesOutOnAnEmptyRing) {
  LocalRing ring(8);
  RingConsumer<Msg> c(ring.region());
  const absl::Time start = absl::Now();
  EXPECT_FALSE(c.WaitForData(absl::Milliseconds(30)));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(25));
  EXPECT_LT(took, absl::Seconds(2));
  EXPECT_EQ(ring.control().consumer_waiting.load(), 0u);
  EXPECT_FALSE(c.WaitForData(absl::ZeroDuration()));
}

TEST(RingTest, PushWakesASleepingConsumer) {
  LocalRing ring(8);
  RingConsumer<Msg> c(ring.region());
  RingProducer<Msg> p(ring.region());
  std::atomic<bool> woke{false};
  absl::Duration waited;
  std::thread consumer([&] {
    const absl::Time start = absl::Now();
    woke = c.WaitForData(absl::Seconds(20));
    waited = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(p.TryPush(Make(1)));
  consumer.join();
  EXPECT_TRUE(woke);
  EXPECT_LT(waited, absl::Seconds(5));  // woken, not timed out
}

// Two threads, a small ring, both sides sleeping on futexes: every wake-up must arrive (a lost
// one would show as a 1 s timeout).
TEST(RingTest, TwoThreadsWithBlockingWaitsLoseNothing) {
  constexpr uint64_t kCount = 1000000;
  LocalRing ring(64);
  std::atomic<int> timeouts{0};
  std::thread producer([&] {
    RingProducer<Msg> p(ring.region());
    std::vector<Msg> batch;
    uint64_t next = 0;
    while (next < kCount) {
      batch.clear();
      for (uint64_t i = next; i < std::min(kCount, next + 1 + next % 37); ++i) batch.push_back(Make(i));
      const size_t k = p.TryPushBatch(batch);
      next += k;
      if (k == 0 && !p.WaitForSpace(absl::Seconds(1))) ++timeouts;
    }
  });
  RingConsumer<Msg> c(ring.region());
  std::vector<Msg> out(23);
  uint64_t expect = 0;
  bool ok = true;
  const absl::Time start = absl::Now();
  while (expect < kCount && ok) {
    const size_t k = c.PopBatch(absl::MakeSpan(out));
    for (size_t i = 0; i < k; ++i) {
      if (out[i].seq != expect || out[i].check != Check(expect)) ok = false;
      ++expect;
    }
    if (k == 0 && !c.WaitForData(absl::Seconds(1))) ++timeouts;
    if (absl::Now() - start > absl::Seconds(60)) break;
  }
  producer.join();
  EXPECT_TRUE(ok);
  EXPECT_EQ(expect, kCount);
  EXPECT_EQ(timeouts.load(), 0);
}

}  // namespace
}  // namespace mer::shm
