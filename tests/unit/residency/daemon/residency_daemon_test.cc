// ResidencyDaemon in-process: a real segment, a packed micro store, the daemon on a thread (or
// driven turn by turn) and a ResidencyClient as compute.
#include "services/residency/daemon/residency_daemon.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/time/clock.h"
#include "common/base/check.h"
#include "common/io/fault_injecting_io_engine.h"
#include "common/model/synth_model.h"
#include "common/store/packer.h"
#include "tests/unit/residency/daemon/daemon_fixture.h"

namespace mer::residency {
namespace {

using ::testing::HasSubstr;

const std::string& StoreDir() { return SynthStoreDir("micro", SynthQuant::kQ8_0); }

bool SameAsStore(const ExpertStore& store, int layer, int expert, absl::Span<const uint8_t> b) {
  AlignedBuffer buf = AllocateAligned(store.blob_bytes());
  if (!store.ReadBlob(layer, expert, buf.get()).ok()) return false;
  return b.size() >= store.blob_bytes() && std::memcmp(buf.get(), b.data(), store.blob_bytes()) == 0;
}

TEST(ResidencyDaemonTest, SlotCountFromBudget) {
  auto store = ExpertStore::Open(StoreDir());
  ASSERT_TRUE(store.ok());
  ResidencyOptions o;
  o.ram_budget_bytes = 1;
  EXPECT_EQ(RamSlotCount(**store, o), 1u);  // the engine acquires experts one group at a time
  o.min_ram_slots = 3;
  EXPECT_EQ(RamSlotCount(**store, o), 3u);
  o.min_ram_slots = 0;
  o.ram_budget_bytes = (*store)->blob_bytes() * 12;
  EXPECT_EQ(RamSlotCount(**store, o), 12u);
  o.ram_budget_bytes = uint64_t{1} << 40;  // capped at every expert
  EXPECT_EQ(RamSlotCount(**store, o), static_cast<uint32_t>((*store)->n_layer() * (*store)->n_expert()));
}

TEST(ResidencyDaemonTest, ServesMissesThenHits) {
  DaemonFixture f;
  auto seg = AttachCompute(f);
  shm::ResidencyClient client(seg.get());
  const std::vector<int32_t> experts = {0, 3, 5};
  for (int round = 0; round < 2; ++round) {
    auto step = client.BeginStep();
    ASSERT_TRUE(step.ok());
    std::vector<shm::PinnedExpert> pinned;
    ASSERT_TRUE(client.Acquire(*step, 1, experts, absl::Now() + absl::Seconds(10), &pinned).ok());
    for (size_t i = 0; i < experts.size(); ++i)
      EXPECT_TRUE(SameAsStore(f.store(), 1, experts[i], pinned[i].bytes)) << experts[i];
    client.Release(pinned);
    client.EndStep(*step);
  }
  EXPECT_EQ(client.stats().hits, 3u);
  const ResidencyCounters c = f.Stop();
  EXPECT_EQ(c.misses, 3u);
  EXPECT_EQ(c.loads, 3u);
  EXPECT_EQ(c.bytes_read, 3 * f.store().blob_bytes());
  EXPECT_EQ(c.checksum_failures, 0u);
  // What the Prometheus exporter reads: stalls of the three misses, the latency histogram, gauges.
  EXPECT_EQ(c.stalled_completions, 3u);
  EXPECT_GT(c.stall_ns_total, 0u);
  uint64_t in_histogram = 0;
  for (uint64_t n : c.read_latency_buckets) in_histogram += n;
  EXPECT_EQ(in_histogram, c.reads);
  EXPECT_GT(c.read_latency_seconds_total, 0.0);
  EXPECT_EQ(c.io_inflight, 0u);
  EXPECT_EQ(c.slots_resident, 3u);
  EXPECT_EQ(c.slots_pinned, 0u);
  EXPECT_EQ(c.slots_loading, 0u);
  EXPECT_EQ(c.slots_free + c.slots_resident, f.daemon().ram_slots());
}

TEST(ResidencyDaemonTest, WarmingFillsFreeSlotsOnlyAndDemandsThenHit) {
  const auto store = ExpertStore::Open(StoreDir());
  ASSERT_TRUE(store.ok());
  const uint32_t all = static_cast<uint32_t>((*store)->n_layer() * (*store)->n_expert());
  ResidencyOptions o;
  o.warm = true;
  // A tier of half the experts: warming fills it and evicts nothing.
  o.ram_budget_bytes = (*store)->blob_bytes() * (all / 2);
  DaemonFixture f(o);
  auto seg = AttachCompute(f);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (f.daemon().Snapshot().slots_resident < all / 2 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(1));
  // Layer 0 came first: its experts are resident, so a step on it hits without a demand.
  shm::ResidencyClient client(seg.get());
  auto step = client.BeginStep();
  ASSERT_TRUE(step.ok());
  std::vector<shm::PinnedExpert> pinned;
  const std::vector<int32_t> experts = {0, 1, 2};
  ASSERT_TRUE(client.Acquire(*step, 0, experts, absl::Now() + absl::Seconds(10), &pinned).ok());
  for (size_t i = 0; i < experts.size(); ++i) EXPECT_TRUE(SameAsStore(f.store(), 0, experts[i], pinned[i].bytes));
  client.Release(pinned);
  client.EndStep(*step);
  EXPECT_EQ(client.stats().hits, 3u);
  EXPECT_EQ(client.stats().demands, 0u);
  const ResidencyCounters c = f.Stop();
  EXPECT_EQ(c.warm_loads, all / 2);
  EXPECT_EQ(c.slots_free, 0u);
  EXPECT_EQ(c.evictions, 0u);
  EXPECT_EQ(c.prefetch_issued, 0u);
  EXPECT_EQ(c.misses, 0u);
}

// One expert-parallel rank's instance (expert share 1/3): warming reads the experts e = 1 mod 3 of
// every layer, though the tier could hold them all, and a demand for another rank's expert (a
// replicated one) is served from the store.
TEST(ResidencyDaemonTest, WarmingReadsOnlyTheExpertShare) {
  const auto store = ExpertStore::Open(StoreDir());
  ASSERT_TRUE(store.ok());
  const int n_layer = (*store)->n_layer(), n_expert = (*store)->n_expert();
  ResidencyOptions o;
  o.warm = true;
  o.expert_share_ranks = 3;
  o.expert_share_rank = 1;
  o.ram_budget_bytes = (*store)->blob_bytes() * n_layer * n_expert;
  const uint32_t share = static_cast<uint32_t>(n_layer) * ShareExpertsPerLayer(o, n_expert);
  ASSERT_EQ(ShareExpertsPerLayer(o, n_expert), static_cast<uint32_t>((n_expert + 1) / 3));
  DaemonFixture f(o);
  auto seg = AttachCompute(f);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (f.daemon().Snapshot().slots_resident < share && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  shm::ResidencyClient client(seg.get());
  const int last = n_layer - 1;
  const std::vector<int32_t> ours = {1, 4}, theirs = {0, 2};
  for (const auto* experts : {&ours, &theirs}) {
    auto step = client.BeginStep();
    ASSERT_TRUE(step.ok());
    std::vector<shm::PinnedExpert> pinned;
    ASSERT_TRUE(client.Acquire(*step, last, *experts, absl::Now() + absl::Seconds(10), &pinned).ok());
    for (size_t i = 0; i < experts->size(); ++i)
      EXPECT_TRUE(SameAsStore(f.store(), last, (*experts)[i], pinned[i].bytes)) << (*experts)[i];
    client.Release(pinned);
    client.EndStep(*step);
  }
  EXPECT_EQ(client.stats().hits, 2u);     // the share's, warmed
  EXPECT_EQ(client.stats().demands, 2u);  // the others', read on demand
  const ResidencyCounters c = f.Stop();
  EXPECT_EQ(c.warm_loads, share);
  EXPECT_EQ(c.misses, 2u);
  EXPECT_EQ(c.slots_resident, share + 2);
}

TEST(ResidencyDaemonTest, CoalescesDuplicateDemands) {
  DaemonFixture f({}, {}, /*thread=*/false);
  auto seg = AttachCompute(f);
  shm::RingProducer<shm::DemandRequest> demand(seg->demand_ring());
  shm::RingConsumer<shm::Completion> completions(seg->completion_ring());
  for (uint64_t id = 1; id <= 3; ++id) {
    shm::DemandRequest d{};
    d.layer = 0;
    d.expert = 6;
    d.request_id = id;
    ASSERT_TRUE(demand.TryPush(d));
  }
  std::vector<shm::Completion> got;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (got.size() < 3 && absl::Now() < deadline) {
    ASSERT_TRUE(f.daemon().Turn().ok());
    shm::Completion c;
    while (completions.TryPop(&c)) got.push_back(c);
  }
  ASSERT_EQ(got.size(), 3u);
  for (const shm::Completion& c : got) {
    EXPECT_EQ(c.status, 0);
    EXPECT_EQ(c.slot, got[0].slot);
  }
  const ResidencyCounters c = f.daemon().Snapshot();
  EXPECT_EQ(c.misses, 3u);
  EXPECT_EQ(c.coalesced, 2u);
  EXPECT_EQ(c.reads, 1u);
}

TEST(ResidencyDaemonTest, EvictsUnpinnedOnlyAndKeepsPinnedBytes) {
  ResidencyOptions o;
  o.ram_budget_bytes = 1;
  o.min_ram_slots = 9;  // n_expert + 1 for 16 experts: one layer pinned, one slot to churn
  DaemonFixture f(o);
  ASSERT_EQ(f.daemon().ram_slots(), static_cast<uint32_t>(f.store().n_expert() + 1));
  auto seg = AttachCompute(f);
  shm::ResidencyClient client(seg.get());
  const int n = f.store().n_expert();
  std::vector<int32_t> all(n);
  for (int e = 0; e < n; ++e) all[e] = e;
  // Hold all of layer 0 pinned while layer 1 churns through the one remaining slot.
  auto held_step = client.BeginStep();
  ASSERT_TRUE(held_step.ok());
  std::vector<shm::PinnedExpert> held;
  ASSERT_TRUE(client.Acquire(*held_step, 0, all, absl::Now() + absl::Seconds(10), &held).ok());
  for (int round = 0; round < 3; ++round) {
    for (int e = 0; e < n; ++e) {
      ASSERT_TRUE(AcquireOne(client, 1, e, [&](absl::Span<const uint8_t> bytes) {
                    EXPECT_TRUE(SameAsStore(f.store(), 1, e, bytes));
                  }).ok());
    }
  }
  for (int e = 0; e < n; ++e) EXPECT_TRUE(SameAsStore(f.store(), 0, e, held[e].bytes)) << e;
  client.Release(held);
  client.EndStep(*held_step);
  const ResidencyCounters c = f.Stop();
  EXPECT_GE(c.evictions, static_cast<uint64_t>(3 * n - 1));
}

// Compute pins a resident expert without asking the daemon; the daemon must still see that use, or
// its LRU degenerates to FIFO and evicts the hottest expert.
TEST(ResidencyDaemonTest, ComputeSideHitsReachThePolicy) {
  ResidencyOptions o;
  o.ram_budget_bytes = 1;
  o.min_ram_slots = 2;
  o.policy = "lru";
  DaemonFixture f(o);
  auto seg = AttachCompute(f);
  shm::ResidencyClient client(seg.get());
  const auto use = [&](int32_t expert) { ASSERT_TRUE(AcquireOne(client, 0, expert).ok()); };
  use(0);  // miss: loads 0
  use(1);  // miss: loads 1
  use(0);  // hit in compute alone: 0 is now the most recently used
  EXPECT_EQ(client.stats().hits, 1u);
  use(2);  // miss: must evict 1, not 0
  const auto in_ram = [&](int32_t expert) {
    const auto s = seg->table().Read(0, expert);
    return s.has_value() && s->in(shm::Pool::kRam);
  };
  EXPECT_TRUE(in_ram(0));
  EXPECT_FALSE(in_ram(1));
  EXPECT_TRUE(in_ram(2));
  const ResidencyCounters c = f.Stop();
  EXPECT_EQ(c.compute_hits, 1u);  // counted as a lookup that hit, though no demand was sent
  EXPECT_EQ(c.lookups, 3u);
  EXPECT_EQ(c.misses, 3u);
}

TEST(ResidencyDaemonTest, RefetchesAfterChecksumMismatch) {
  auto store = ExpertStore::Open(StoreDir());
  ASSERT_TRUE(store.ok());
  FaultRule r;
  r.kind = FaultKind::kBitFlip;
  r.offset_begin = (*store)->BlobOffset(1, 2);
  r.offset_end = r.offset_begin + (*store)->blob_bytes();
  r.times = 1;
  DaemonFixture f({}, {r});
  auto seg = AttachCompute(f);
  shm::ResidencyClient client(seg.get());
  ASSERT_TRUE(AcquireOne(client, 1, 2, [&](absl::Span<const uint8_t> bytes) {
                EXPECT_TRUE(SameAsStore(f.store(), 1, 2, bytes));
              }).ok());
  const ResidencyCounters c = f.Stop();
  EXPECT_EQ(c.checksum_failures, 1u);
  EXPECT_EQ(c.refetches, 1u);
  EXPECT_EQ(c.loads, 1u);
}

TEST(ResidencyDaemonTest, PersistentCorruptionIsDataLossNamingTheExpert) {
  auto store = ExpertStore::Open(StoreDir());
  ASSERT_TRUE(store.ok());
  FaultRule r;
  r.kind = FaultKind::kBitFlip;
  r.offset_begin = (*store)->BlobOffset(0, 4);
  r.offset_end = r.offset_begin + (*store)->blob_bytes();
  DaemonFixture f({}, {r});
  auto seg = AttachCompute(f);
  shm::ResidencyClient client(seg.get());
  auto step = client.BeginStep();
  ASSERT_TRUE(step.ok());
  std::vector<shm::PinnedExpert> p;
  const int32_t e[] = {1, 4};
  const absl::Status s = client.Acquire(*step, 0, e, absl::Now() + absl::Seconds(10), &p);
  client.EndStep(*step);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("4"));
  const auto entry = seg->table().Read(0, 4);
  ASSERT_TRUE(entry.has_value());
  EXPECT_FALSE(entry->in(shm::Pool::kRam));  // never published
  const ResidencyCounters c = f.Stop();
  EXPECT_EQ(c.checksum_failures, 3u);  // the read and two refetches
  EXPECT_EQ(c.load_failures, 1u);
}

// Driven turn by turn: the acquire that follows the prefetch needs no daemon, since it hits.
TEST(ResidencyDaemonTest, PrefetchFromPredictedHint) {
  ResidencyOptions o;
  o.prefetch = true;
  DaemonFixture f(o, {}, /*thread=*/false);
  auto seg = AttachCompute(f);
  shm::ResidencyClient client(seg.get());
  shm::Hint h{};
  h.layer = 1;
  h.count = 1;
  h.kind = 1;
  h.experts[0] = 7;
  h.confidence[0] = 200;
  ASSERT_TRUE(client.SendHint(h));
  const auto in_ram = [&] {
    const auto s = seg->table().Read(1, 7);
    return s.has_value() && s->in(shm::Pool::kRam);
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!in_ram() && absl::Now() < deadline) ASSERT_TRUE(f.daemon().Turn().ok());
  ASSERT_TRUE(in_ram());
  ASSERT_TRUE(AcquireOne(client, 1, 7).ok());
  EXPECT_EQ(client.stats().hits, 1u);
  const ResidencyCounters c = f.Stop();
  EXPECT_EQ(c.prefetch_issued, 1u);
  EXPECT_EQ(c.misses, 0u);
}

// The daemon reads time from its clock: gauges are taken at most every kCensusInterval of it, and
// a clock that stands still measures no read latency and no stall.
TEST(ResidencyDaemonTest, CensusIntervalAndLatenciesFollowTheClock) {
  FakeClock clock;
  DaemonFixture f({}, {}, /*thread=*/false, {}, StoreDir(), {}, &clock);
  auto seg = AttachCompute(f);
  shm::ResidencyClient client(seg.get());
  shm::RingProducer<shm::DemandRequest> demand(seg->demand_ring());
  shm::RingConsumer<shm::Completion> completions(seg->completion_ring());
  // A consumed hint is progress: the first publication takes a census, of free slots only.
  shm::Hint h{};
  h.layer = 0;
  h.count = 1;
  h.experts[0] = 1;
  ASSERT_TRUE(client.SendHint(h));
  const absl::StatusOr<bool> turned = f.daemon().Turn();
  ASSERT_TRUE(turned.ok() && *turned);
  EXPECT_EQ(f.daemon().Snapshot().slots_free, f.daemon().ram_slots());
  const auto serve = [&](uint64_t id) {
    shm::DemandRequest d{};
    d.layer = 0;
    d.expert = 2;
    d.request_id = id;
    ASSERT_TRUE(demand.TryPush(d));
    shm::Completion c;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    bool got = false;
    while (!got && absl::Now() < deadline) {
      ASSERT_TRUE(f.daemon().Turn().ok());
      got = completions.TryPop(&c);
    }
    ASSERT_TRUE(got);
    EXPECT_EQ(c.status, 0);
  };
  serve(1);  // a miss: loaded and published, all at the same instant of the clock
  ResidencyCounters c = f.daemon().Snapshot();
  EXPECT_EQ(c.loads, 1u);
  EXPECT_EQ(c.slots_resident, 0u);  // no census since the clock last moved
  EXPECT_EQ(c.slots_free, f.daemon().ram_slots());
  EXPECT_EQ(c.stalled_completions, 1u);
  EXPECT_EQ(c.stall_ns_total, 0u);
  EXPECT_EQ(c.read_latency_us_total, 0u);
  EXPECT_EQ(c.read_latency_buckets[0], 1u);
  clock.Advance(ResidencyDaemon::kCensusInterval);
  serve(2);  // a hit, and the census is due
  c = f.daemon().Snapshot();
  EXPECT_EQ(c.hits, 1u);
  EXPECT_EQ(c.slots_resident, 1u);
  EXPECT_EQ(c.slots_free, f.daemon().ram_slots() - 1);
}

}  // namespace
}  // namespace mer::residency
