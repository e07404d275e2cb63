// ResidencyClient against the in-process FakeResidency: hits and misses, errors carried by
// completions, deadlines, a dead or replaced residency, step epochs, hints, and slot safety under
// eviction churn (a pinned slot is never overwritten).
#include "common/shm/client.h"

#include <unistd.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/shm/fake_residency.h"

namespace mer::shm {
namespace {

using testing::CheckPattern;
using testing::FakeResidency;
using testing::FakeResidencyOptions;

std::string UniqueName(const char* what) {
  static std::atomic<int> counter{0};
  return absl::StrCat("mer-test-client-", what, "-", getpid(), "-", counter++);
}

CreateOptions Options(uint32_t ram_slots) {
  CreateOptions o;
  o.geometry.model_identity = 77;
  o.geometry.n_layer = 4;
  o.geometry.n_expert = 32;
  o.geometry.demand_capacity = 8;  // small, so full rings are exercised
  o.geometry.hint_capacity = 4;
  o.geometry.completion_capacity = 8;
  o.geometry.ram_slot_count = ram_slots;
  o.geometry.ram_slot_bytes = 4096;
  return o;
}
const ExpectedIdentity kId{77, 4, 32};

// A residency segment with a FakeResidency thread, and a compute segment + client.
class Fixture {
 public:
  explicit Fixture(uint32_t ram_slots, FakeResidencyOptions fake = {}, bool serve = true) : name_(UniqueName("fx")) {
    res_ = std::move(ShmSegment::Create(name_, Options(ram_slots)).value());
    res_->StartHeartbeat(absl::Milliseconds(5));
    comp_ = std::move(ShmSegment::Attach(name_, kId).value());
    fake_ = std::make_unique<FakeResidency>(res_.get(), fake);
    ClientOptions co;
    co.peer_timeout = absl::Milliseconds(400);
    co.poll_interval = absl::Milliseconds(2);
    client_ = std::make_unique<ResidencyClient>(comp_.get(), co);
    if (serve) thread_ = std::thread([this] { fake_->Run(stop_); });
  }
  ~Fixture() { StopServing(); }
  void StopServing() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  const std::string& name() const { return name_; }
  ShmSegment& res() { return *res_; }
  ResidencyClient& client() { return *client_; }
  FakeResidency& fake() { return *fake_; }
  std::unique_ptr<ShmSegment>& res_ptr() { return res_; }

 private:
  std::string name_;
  std::unique_ptr<ShmSegment> res_, comp_;
  std::unique_ptr<FakeResidency> fake_;
  std::unique_ptr<ResidencyClient> client_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

TEST(ClientTest, MissThenHit) {
  Fixture f(8);
  ResidencyClient& c = f.client();
  absl::StatusOr<Step> step = c.BeginStep();
  ASSERT_TRUE(step.ok());
  const int32_t experts[] = {3, 17, 5};
  std::vector<PinnedExpert> pinned;
  ASSERT_TRUE(c.Acquire(*step, 1, experts, Soon(), &pinned).ok());
  ASSERT_EQ(pinned.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(pinned[i].layer, 1u);
    EXPECT_EQ(pinned[i].expert, static_cast<uint32_t>(experts[i]));
    EXPECT_EQ(pinned[i].bytes.size(), 4096u);
    EXPECT_TRUE(CheckPattern(pinned[i].bytes, 1, experts[i]));
    EXPECT_EQ(c.segment().pins(Pool::kRam).RawCount(pinned[i].slot), 1u);
  }
  EXPECT_EQ(c.stats().hits, 0u);
  EXPECT_EQ(c.stats().demands, 3u);
  c.Release(pinned);
  for (const PinnedExpert& p : pinned) EXPECT_EQ(c.segment().pins(Pool::kRam).RawCount(p.slot), 0u);
  c.EndStep(*step);

  step = c.BeginStep();
  ASSERT_TRUE(c.Acquire(*step, 1, experts, Soon(), &pinned).ok());
  EXPECT_EQ(c.stats().hits, 3u);
  EXPECT_EQ(c.stats().demands, 3u);  // nothing asked: all resident
  const ResidencyEntry& e = c.segment().table().entry(1, 17);
  EXPECT_EQ(e.hits.load(), 1u);
  EXPECT_EQ(e.misses.load(), 1u);
  EXPECT_EQ(e.last_use_epoch.load(), step->epoch);
  c.Release(pinned);
  c.EndStep(*step);
}

TEST(ClientTest, MoreExpertsThanTheDemandRingHolds) {
  Fixture f(32);
  ResidencyClient& c = f.client();
  Step step = *c.BeginStep();
  std::vector<int32_t> experts;
  for (int i = 0; i < 30; ++i) experts.push_back(i);
  std::vector<PinnedExpert> pinned;
  ASSERT_TRUE(c.Acquire(step, 2, experts, Soon(), &pinned).ok());
  for (int i = 0; i < 30; ++i) EXPECT_TRUE(CheckPattern(pinned[i].bytes, 2, i)) << i;
  c.Release(pinned);
  c.EndStep(step);
}

TEST(ClientTest, DataLossIsReportedWithTheExpert) {
  FakeResidencyOptions fo;
  fo.fail_layer = 0;
  fo.fail_expert = 9;
  Fixture f(8, fo);
  ResidencyClient& c = f.client();
  Step step = *c.BeginStep();
  const int32_t experts[] = {1, 9, 2};
  std::vector<PinnedExpert> pinned;
  absl::Status st = c.Acquire(step, 0, experts, Soon(), &pinned);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find("layer 0 expert 9"), absl::string_view::npos) << st;
  EXPECT_TRUE(pinned.empty());
  for (uint32_t k = 0; k < 8; ++k) EXPECT_EQ(c.segment().pins(Pool::kRam).RawCount(k), 0u) << k;
  const std::optional<EntryState> s = c.segment().table().Read(0, 9);
  EXPECT_TRUE(s->tiers & kTierFailed);
  EXPECT_EQ(s->error, static_cast<uint32_t>(absl::StatusCode::kDataLoss));
}

TEST(ClientTest, InvalidArguments) {
  Fixture f(4);
  Step step = *f.client().BeginStep();
  std::vector<PinnedExpert> pinned;
  const int32_t bad_expert[] = {32};
  const int32_t negative[] = {-1};
  const int32_t ok[] = {0};
  EXPECT_TRUE(absl::IsInvalidArgument(f.client().Acquire(step, 0, bad_expert, Soon(), &pinned)));
  EXPECT_TRUE(absl::IsInvalidArgument(f.client().Acquire(step, 0, negative, Soon(), &pinned)));
  EXPECT_TRUE(absl::IsInvalidArgument(f.client().Acquire(step, 4, ok, Soon(), &pinned)));
}

TEST(ClientTest, DeadlineWhenResidencyDoesNotAnswer) {
  Fixture f(4, {}, /*serve=*/false);  // alive (heartbeat), but never completes
  Step step = *f.client().BeginStep();
  const int32_t experts[] = {1};
  std::vector<PinnedExpert> pinned;
  const absl::Time start = absl::Now();
  absl::Status st = f.client().Acquire(step, 0, experts, start + absl::Milliseconds(50), &pinned);
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ClientTest, UnavailableWhenResidencyHeartbeatStops) {
  Fixture f(4, {}, /*serve=*/false);
  f.res().StopHeartbeat();  // as if the process froze or died
  Step step = *f.client().BeginStep();
  const int32_t experts[] = {1};
  std::vector<PinnedExpert> pinned;
  const absl::Time start = absl::Now();
  absl::Status st = f.client().Acquire(step, 0, experts, start + absl::Seconds(20), &pinned);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("heartbeat"), absl::string_view::npos) << st;
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(ClientTest, UnavailableWhenResidencyIsReplacedThenReconnect) {
  Fixture f(4, {}, /*serve=*/false);
  Step step = *f.client().BeginStep();
  const int32_t experts[] = {1};
  std::vector<PinnedExpert> pinned;
  absl::Status st;
  std::thread waiter([&] { st = f.client().Acquire(step, 0, experts, absl::Now() + absl::Seconds(20), &pinned); });
  absl::SleepFor(absl::Milliseconds(30));
  // A new mer-residency creates the segment again: the old one is superseded.
  auto fresh = ShmSegment::Create(f.name(), Options(4));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  (*fresh)->StartHeartbeat(absl::Milliseconds(5));
  waiter.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find("superseded"), absl::string_view::npos) << st;

  auto seg = ResidencyClient::Reconnect(f.name(), kId, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(seg.ok()) << seg.status();
  FakeResidency fake(fresh->get());
  std::atomic<bool> stop{false};
  std::thread server([&] { fake.Run(stop); });
  ResidencyClient client(seg->get());
  Step s2 = *client.BeginStep();
  EXPECT_GT(s2.epoch, 0u);
  ASSERT_TRUE(client.Acquire(s2, 0, experts, Soon(), &pinned).ok());
  EXPECT_TRUE(CheckPattern(pinned[0].bytes, 0, 1));
  client.Release(pinned);
  client.EndStep(s2);
  stop = true;
  server.join();
}

TEST(ClientTest, StepEpochs) {
  Fixture f(4, {}, /*serve=*/false);
  ResidencyClient& c = f.client();
  ResidencyEndpoint ep(&f.res());
  EXPECT_EQ(ep.MinInflightEpoch(), 1u);
  std::vector<Step> steps;
  for (uint32_t i = 0; i < kMaxStepsInFlight; ++i) {
    absl::StatusOr<Step> s = c.BeginStep();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->epoch, i + 1);
    steps.push_back(*s);
  }
  EXPECT_TRUE(absl::IsResourceExhausted(c.BeginStep().status()));
  EXPECT_EQ(ep.MinInflightEpoch(), 1u);
  c.EndStep(steps[0]);
  c.EndStep(steps[1]);
  EXPECT_EQ(ep.MinInflightEpoch(), 3u);
  absl::StatusOr<Step> s = c.BeginStep();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->epoch, kMaxStepsInFlight + 1);
  for (size_t i = 2; i < steps.size(); ++i) c.EndStep(steps[i]);
  EXPECT_EQ(ep.MinInflightEpoch(), kMaxStepsInFlight + 1);
  c.EndStep(*s);
  EXPECT_EQ(ep.MinInflightEpoch(), kMaxStepsInFlight + 2);
}

TEST(ClientTest, HintsAreBestEffort) {
  Fixture f(4, {}, /*serve=*/false);
  Hint h{};
  h.layer = 2;
  h.count = 2;
  h.kind = static_cast<uint8_t>(HintKind::kPredicted);
  h.experts[0] = 5;
  h.experts[1] = 6;
  h.confidence[0] = 200;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(f.client().SendHint(h));
  EXPECT_FALSE(f.client().SendHint(h));  // ring of 4 is full
  EXPECT_EQ(f.client().stats().hints_dropped, 1u);
  ResidencyEndpoint& ep = f.fake().endpoint();
  Hint got;
  ASSERT_TRUE(ep.hints().TryPop(&got));
  EXPECT_EQ(got.layer, 2u);
  EXPECT_EQ(got.experts[1], 6u);
  EXPECT_EQ(got.confidence[0], 200);
}

TEST(ClientTest, PinsOfADeadComputeIncarnationDoNotBlockReuse) {
  Fixture f(2, {}, /*serve=*/false);
  ResidencyEndpoint& ep = f.fake().endpoint();
  ep.PublishResident(0, 0, 1);
  Step step = *f.client().BeginStep();
  PinnedExpert p;
  ASSERT_TRUE(f.client().TryPin(0, 0, Pool::kRam, step.epoch, &p));
  ep.EvictRam(0, 0);
  EXPECT_FALSE(ep.SlotReusable(Pool::kRam, 1));  // pinned by the live compute
  // A new compute attaches (the old one "died" holding the pin): the pin is void.
  auto comp2 = ShmSegment::Attach(f.name(), kId);
  ASSERT_TRUE(comp2.ok()) << comp2.status();
  EXPECT_TRUE(ep.SlotReusable(Pool::kRam, 1));
}

// Slot safety: 4 RAM slots for 32 experts, the fake evicts after every load, and the client
// verifies every pinned slot's bytes at pin time and again after holding it. A slot overwritten
// while pinned would show as a pattern mismatch.
TEST(ClientTest, PinnedSlotsAreNeverOverwrittenUnderChurn) {
  FakeResidencyOptions fo;
  fo.churn = true;
  Fixture f(4, fo);
  ResidencyClient& c = f.client();
  std::mt19937 rng(1);
  int corrupt = 0, steps = 0;
  const absl::Time end = absl::Now() + absl::Milliseconds(700);
  while (absl::Now() < end) {
    Step step = *c.BeginStep();
    int32_t experts[2] = {static_cast<int32_t>(rng() % 32), static_cast<int32_t>(rng() % 32)};
    const uint32_t layer = rng() % 4;
    std::vector<PinnedExpert> pinned;
    absl::Status st = c.Acquire(step, layer, experts, Soon(), &pinned);
    ASSERT_TRUE(st.ok()) << st;
    for (int i = 0; i < 2; ++i) corrupt += !CheckPattern(pinned[i].bytes, layer, experts[i]);
    std::this_thread::yield();
    for (int i = 0; i < 2; ++i) corrupt += !CheckPattern(pinned[i].bytes, layer, experts[i]);
    c.Release(pinned);
    c.EndStep(step);
    ++steps;
  }
  f.StopServing();
  EXPECT_EQ(corrupt, 0);
  EXPECT_GT(steps, 100);
  EXPECT_GT(f.fake().evictions(), 100u);
  RecordProperty("steps", steps);
}

}  // namespace
}  // namespace mer::shm
