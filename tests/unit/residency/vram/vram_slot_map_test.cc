#include "services/residency/vram/vram_slot_map.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <vector>

namespace mer::residency {
namespace {

constexpr uint64_t kAny = std::numeric_limits<uint64_t>::max();

TEST(VramSlotMapTest, FreeSlotsFirstThenLeastRecentlyUsed) {
  VramSlotMap m;
  m.Reset(3);
  const std::set<uint32_t> none;
  const std::vector<uint64_t> pin_epoch(3, 0);
  auto in_use = [&](uint32_t k) { return none.count(k) != 0; };
  auto pe = [&](uint32_t k) { return pin_epoch[k]; };
  for (uint32_t e = 0; e < 3; ++e) {
    const auto k = m.Candidate(in_use, pe, kAny);
    ASSERT_TRUE(k.has_value());
    EXPECT_EQ(m.owner(*k), VramSlotMap::kFree);
    m.Fill(*k, 10 + e, /*epoch=*/5 + e);
    m.Filled(*k);
  }
  EXPECT_EQ(m.free_slots(), 0u);
  // Slot 0 was filled first (epoch 5): the victim.
  EXPECT_EQ(m.Candidate(in_use, pe, kAny), 0u);
  m.Touch(0, 9);
  EXPECT_EQ(m.Candidate(in_use, pe, kAny), 1u);
}

TEST(VramSlotMapTest, NeverOffersAPinnedOrFillingSlot) {
  VramSlotMap m;
  m.Reset(4);
  std::set<uint32_t> pinned = {0, 2};
  std::vector<uint64_t> pin_epoch = {1, 0, 1, 0};
  auto in_use = [&](uint32_t k) { return pinned.count(k) != 0; };
  auto pe = [&](uint32_t k) { return pin_epoch[k]; };
  // Free but pinned (a step of the last compute still reads it): not offered.
  EXPECT_EQ(m.Candidate(in_use, pe, kAny), 1u);
  m.Fill(1, 7, 1);  // filling: not offered either, even as the only unpinned slot
  EXPECT_EQ(m.Candidate(in_use, pe, kAny), 3u);
  m.Fill(3, 8, 1);
  m.Filled(3);
  EXPECT_EQ(m.Candidate(in_use, pe, kAny), 3u);  // resident, unpinned: the victim
  pinned.insert(3);
  EXPECT_FALSE(m.Candidate(in_use, pe, kAny).has_value());
  // Under churn: whatever is offered is never pinned nor filling.
  for (int round = 0; round < 1000; ++round) {
    pinned.clear();
    for (uint32_t k = 0; k < 4; ++k)
      if ((round * 7 + k * 3) % 5 < 2) pinned.insert(k);
    const auto k = m.Candidate(in_use, pe, kAny);
    if (!k.has_value()) continue;
    ASSERT_EQ(pinned.count(*k), 0u) << "round " << round;
    ASSERT_FALSE(m.filling(*k)) << "round " << round;
    if (m.owner(*k) != VramSlotMap::kFree) m.Release(*k);
    m.Fill(*k, 100 + round, round);
    if (round % 3 != 0)
      m.Filled(*k);
    else
      m.Release(*k);  // a failed copy
  }
}

TEST(VramSlotMapTest, APrefetchTakesOnlySlotsUnusedByStepsInFlight) {
  VramSlotMap m;
  m.Reset(2);
  std::vector<uint64_t> pin_epoch = {0, 0};
  auto in_use = [](uint32_t) { return false; };
  auto pe = [&](uint32_t k) { return pin_epoch[k]; };
  m.Fill(0, 1, 3);
  m.Filled(0);
  m.Fill(1, 2, 4);
  m.Filled(1);
  pin_epoch[0] = 12;  // compute pinned slot 0 in step 12, slot 1 last at its fill (4)
  EXPECT_EQ(m.Candidate(in_use, pe, /*used_before=*/10), 1u);
  pin_epoch[1] = 11;
  EXPECT_FALSE(m.Candidate(in_use, pe, 10).has_value());  // both used by steps from 10 on
  EXPECT_EQ(m.Candidate(in_use, pe, kAny), 1u);           // a demand takes the older
}

// The map against a plain scan of every slot (what Candidate returns by its contract), under
// random fills, completions, releases, touches, pins and pin epochs, epochs out of order included.
TEST(VramSlotMapTest, MatchesAScanOfEverySlot) {
  constexpr uint32_t kSlots = 12;
  std::mt19937 rng(11);
  VramSlotMap m;
  m.Reset(kSlots);
  struct Ref {
    uint32_t owner = VramSlotMap::kFree;
    bool filling = false;
    uint64_t use = 0;
  };
  std::vector<Ref> ref(kSlots);
  std::vector<uint64_t> pin_epoch(kSlots, 0);
  std::vector<bool> pinned(kSlots, false);
  auto in_use = [&](uint32_t k) { return static_cast<bool>(pinned[k]); };
  auto pe = [&](uint32_t k) { return pin_epoch[k]; };
  const auto scan = [&](uint64_t used_before) -> std::optional<uint32_t> {
    for (uint32_t k = 0; k < kSlots; ++k)
      if (ref[k].owner == VramSlotMap::kFree && !pinned[k]) return k;
    std::optional<uint32_t> best;
    uint64_t best_use = 0;
    for (uint32_t k = 0; k < kSlots; ++k) {
      if (ref[k].owner == VramSlotMap::kFree || ref[k].filling || pinned[k]) continue;
      const uint64_t use = std::max(pin_epoch[k], ref[k].use);
      if (use >= used_before) continue;
      if (!best.has_value() || use < best_use) {
        best = k;
        best_use = use;
      }
    }
    return best;
  };
  uint64_t epoch = 10;
  for (int step = 0; step < 20000; ++step) {
    epoch += rng() % 8 == 0;               // many uses share an epoch: ties go to the lowest index
    const uint64_t e = epoch - rng() % 3;  // mostly in order, sometimes older
    const uint32_t k = rng() % kSlots;
    switch (rng() % 6) {
      case 0:
        if (!ref[k].filling) {
          m.Fill(k, 100 + k, e);
          ref[k] = {100 + k, true, e};
        }
        break;
      case 1:
        if (ref[k].filling) {
          m.Filled(k);
          ref[k].filling = false;
        }
        break;
      case 2:
        m.Release(k);
        ref[k] = Ref{};
        break;
      case 3:
        m.Touch(k, e);
        if (e > ref[k].use) ref[k].use = e;
        break;
      case 4:
        pinned[k] = !pinned[k];
        break;
      default:
        pin_epoch[k] = std::max(pin_epoch[k], e);
        break;
    }
    for (const uint64_t before : {kAny, epoch, epoch - 3}) {
      ASSERT_EQ(m.Candidate(in_use, pe, before), scan(before)) << "step " << step;
    }
    uint32_t free = 0, filling = 0;
    for (const Ref& r : ref) {
      free += r.owner == VramSlotMap::kFree;
      filling += r.filling;
    }
    ASSERT_EQ(m.free_slots(), free);
    ASSERT_EQ(m.filling_slots(), filling);
  }
}

}  // namespace
}  // namespace mer::residency
