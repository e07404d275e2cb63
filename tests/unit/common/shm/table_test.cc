// The residency table's seqlock (consistent reads while the writer runs) and the slot pins.
#include "common/shm/residency_table.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mer::shm {
namespace {

class LocalTable {
 public:
  LocalTable(uint32_t n_layer, uint32_t n_expert)
      : entries_(new ResidencyEntry[uint64_t{n_layer} * n_expert]()), table_(entries_.get(), n_layer, n_expert) {
    for (uint64_t i = 0; i < uint64_t{n_layer} * n_expert; ++i) {
      entries_[i].ram_slot = kNoSlot;
      entries_[i].vram_slot = kNoSlot;
    }
  }
  ResidencyTable& table() { return table_; }

 private:
  std::unique_ptr<ResidencyEntry[]> entries_;
  ResidencyTable table_;
};

TEST(TableTest, WriteThenRead) {
  LocalTable t(3, 4);
  std::optional<EntryState> s = t.table().Read(2, 3);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->generation, 0u);
  EXPECT_EQ(s->tiers, 0u);
  EXPECT_EQ(s->ram_slot, kNoSlot);
  EXPECT_FALSE(s->in(Pool::kRam));

  EXPECT_EQ(t.table().Write(2, 3, kTierNvme | kTierRam, 7, kNoSlot), 2u);
  s = t.table().Read(2, 3);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->generation, 2u);
  EXPECT_TRUE(s->in(Pool::kRam));
  EXPECT_FALSE(s->in(Pool::kVram));
  EXPECT_EQ(s->slot(Pool::kRam), 7u);
  EXPECT_EQ(t.table().entry(2, 3).loads.load(), 1u);

  EXPECT_EQ(t.table().Write(2, 3, kTierNvme | kTierFailed, kNoSlot, kNoSlot, 15), 4u);
  s = t.table().Read(2, 3);
  EXPECT_EQ(s->error, 15u);
  EXPECT_EQ(s->generation, 4u);
  // Other entries untouched.
  EXPECT_EQ(t.table().Read(2, 2)->generation, 0u);
}

TEST(TableTest, OutOfRangeAndStuckWriterGiveNullopt) {
  LocalTable t(2, 2);
  EXPECT_FALSE(t.table().Read(2, 0).has_value());
  EXPECT_FALSE(t.table().Read(0, 2).has_value());
  // A writer that died mid-update leaves the generation odd.
  t.table().entry(1, 1).generation.store(5);
  EXPECT_FALSE(t.table().Read(1, 1, /*max_tries=*/100).has_value());
  // A new writer rounds up and carries on.
  EXPECT_EQ(t.table().Write(1, 1, kTierRam, 0, kNoSlot), 8u);
  EXPECT_TRUE(t.table().Read(1, 1).has_value());
}

TEST(TableTest, NoteUseKeepsTheNewestEpochAndCounts) {
  LocalTable t(1, 2);
  t.table().NoteUse(0, 1, 10, true);
  t.table().NoteUse(0, 1, 7, false);
  t.table().NoteUse(0, 1, 12, true);
  t.table().NoteUse(5, 5, 99, true);  // out of range: ignored
  EXPECT_EQ(t.table().entry(0, 1).last_use_epoch.load(), 12u);
  EXPECT_EQ(t.table().entry(0, 1).hits.load(), 2u);
  EXPECT_EQ(t.table().entry(0, 1).misses.load(), 1u);
}

// The writer keeps rewriting entries with fields derived from one value; readers must never see
// fields of two different writes.
TEST(TableTest, SeqlockReadsAreConsistentUnderConcurrentWrites) {
  LocalTable t(2, 4);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, torn{0};
  std::thread writer([&] {
    uint32_t v = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      ++v;
      const uint32_t layer = v & 1, expert = (v >> 1) & 3;
      t.table().Write(layer, expert, v & 0xff, v, v ^ 0xabcdef, v * 3);
    }
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      for (int i = 0; i < 300000; ++i) {
        const std::optional<EntryState> s = t.table().Read(i & 1, (i >> 1) & 3);
        if (!s.has_value()) continue;
        reads.fetch_add(1, std::memory_order_relaxed);
        if (s->generation == 0) continue;
        const uint32_t v = s->ram_slot;
        if (s->tiers != (v & 0xff) || s->vram_slot != (v ^ 0xabcdef) || s->error != v * 3 || (s->generation & 1) != 0) {
          torn.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  stop = true;
  writer.join();
  EXPECT_GT(reads.load(), 100000u);
  EXPECT_EQ(torn.load(), 0u);
}

class LocalPins {
 public:
  explicit LocalPins(uint32_t n) : pins_(new SlotPin[n]()), view_(pins_.get(), n) {}
  SlotPins& pins() { return view_; }

 private:
  std::unique_ptr<SlotPin[]> pins_;
  SlotPins view_;
};

TEST(PinsTest, CountsPerIncarnation) {
  LocalPins p(4);
  SlotPins& pins = p.pins();
  EXPECT_FALSE(pins.InUse(1, 1, false));
  EXPECT_TRUE(pins.Pin(1, /*incarnation=*/1, /*epoch=*/5));
  EXPECT_TRUE(pins.Pin(1, 1, 3));
  EXPECT_EQ(pins.RawCount(1), 2u);
  EXPECT_EQ(pins.LastEpoch(1), 5u);
  EXPECT_TRUE(pins.InUse(1, 1, false));
  EXPECT_FALSE(pins.InUse(1, 1, /*compute_gone=*/true));
  EXPECT_FALSE(pins.InUse(1, 2, false));  // a restarted compute: the old pins are void
  pins.Unpin(1, 2);                       // not ours: ignored
  EXPECT_EQ(pins.RawCount(1), 2u);
  pins.Unpin(1, 1);
  EXPECT_TRUE(pins.InUse(1, 1, false));
  pins.Unpin(1, 1);
  EXPECT_FALSE(pins.InUse(1, 1, false));
  pins.Unpin(1, 1);  // unbalanced: stays 0
  EXPECT_EQ(pins.RawCount(1), 0u);
  EXPECT_FALSE(pins.Pin(4, 1, 1));  // out of range
  EXPECT_FALSE(pins.InUse(4, 1, false));
}

TEST(PinsTest, NewIncarnationReplacesAStaleWord) {
  LocalPins p(1);
  SlotPins& pins = p.pins();
  for (int i = 0; i < 5; ++i) pins.Pin(0, 1, 1);  // a compute that died holding 5 pins
  EXPECT_TRUE(pins.Pin(0, 2, 9));
  EXPECT_EQ(pins.RawCount(0), 1u);
  EXPECT_TRUE(pins.InUse(0, 2, false));
  pins.Unpin(0, 2);
  EXPECT_FALSE(pins.InUse(0, 2, false));
}

TEST(PinsTest, ConcurrentPinsBalance) {
  LocalPins p(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100000; ++i) {
        p.pins().Pin(i & 1, 7, i);
        p.pins().Unpin(i & 1, 7);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(p.pins().RawCount(0), 0u);
  EXPECT_EQ(p.pins().RawCount(1), 0u);
}

}  // namespace
}  // namespace mer::shm
