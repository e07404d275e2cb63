#include "services/residency/policy/replacement_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "services/residency/policy/arc_policy.h"
#include "services/residency/policy/lfu_policy.h"
#include "services/residency/policy/lru_policy.h"

namespace mer::residency {
namespace {

// One lookup through the protocol of replacement_policy.h; returns true on a hit.
bool Lookup(ReplacementPolicy& p, ExpertKey key) {
  if (p.Contains(key)) {
    p.Touch(key);
    return true;
  }
  if (p.size() == p.capacity()) {
    std::optional<ExpertKey> v = p.ChooseVictim([](ExpertKey) { return true; }, key);
    EXPECT_TRUE(v.has_value());
    EXPECT_TRUE(p.Remove(*v));
  }
  p.Admit(key);
  return false;
}

std::optional<ExpertKey> VictimExcept(ReplacementPolicy& p, const std::set<ExpertKey>& pinned,
                                      ExpertKey incoming = kNoKey) {
  return p.ChooseVictim([&](ExpertKey k) { return pinned.count(k) == 0; }, incoming);
}

TEST(ExpertKey, PacksLayerAndExpert) {
  constexpr ExpertKey k = PackExpertKey(93, 127);
  static_assert(KeyLayer(k) == 93 && KeyExpert(k) == 127);
  EXPECT_EQ(PackExpertKey(1, 0), 65536u);
  EXPECT_EQ(KeyLayer(PackExpertKey(65535, 65535)), 65535);
  EXPECT_EQ(KeyExpert(PackExpertKey(65535, 65535)), 65535);
}

TEST(CreatePolicy, ByNameAndErrors) {
  for (const std::string& name : PolicyNames()) {
    auto p = CreatePolicy(name, 4);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ((*p)->name(), name);
    EXPECT_EQ((*p)->capacity(), 4);
    EXPECT_EQ((*p)->size(), 0);
  }
  EXPECT_EQ(CreatePolicy("fifo", 4).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreatePolicy("lru", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreatePolicy("arc", -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LruPolicy, HandCheckedSequence) {
  LruPolicy p(3);
  p.Admit(1);
  p.Admit(2);
  p.Admit(3);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{3, 2, 1}));
  EXPECT_EQ(p.ChooseVictim(), 1u);
  p.Touch(1);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{1, 3, 2}));
  EXPECT_EQ(p.ChooseVictim(), 2u);
  EXPECT_TRUE(p.Remove(2));
  EXPECT_FALSE(p.Remove(2));
  EXPECT_FALSE(p.Contains(2));
  p.Admit(4);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{4, 1, 3}));
  EXPECT_EQ(p.ChooseVictim(), 3u);
  p.Touch(3);
  p.Touch(4);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{4, 3, 1}));
  EXPECT_EQ(p.ChooseVictim(), 1u);
}

TEST(LruPolicy, PinnedKeysAreSkipped) {
  LruPolicy p(3);
  p.Admit(1);
  p.Admit(2);
  p.Admit(3);
  EXPECT_EQ(VictimExcept(p, {1}), 2u);
  EXPECT_EQ(VictimExcept(p, {1, 2}), 3u);
  EXPECT_EQ(VictimExcept(p, {1, 2, 3}), std::nullopt);
  // ChooseVictim changes nothing.
  EXPECT_EQ(p.size(), 3);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{3, 2, 1}));
}

TEST(LruPolicy, PrefetchedKeyWaitsAtTheEvictionEnd) {
  LruPolicy p(3);
  p.Admit(1);
  p.Admit(2);
  p.AdmitPrefetched(3);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{2, 1, 3}));
  EXPECT_EQ(p.ChooseVictim(), 3u);  // a wrong guess goes first
  p.Touch(3);                       // a right one is used and moves up
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{3, 2, 1}));
  EXPECT_EQ(p.ChooseVictim(), 1u);
}

TEST(LruPolicyDeathTest, MisuseIsAProgrammerError) {
  LruPolicy p(1);
  p.Admit(7);
  EXPECT_DEATH(p.Admit(8), "full");
  EXPECT_DEATH(p.Touch(8), "not resident");
}

TEST(LfuPolicy, HandCheckedSequence) {
  LfuOptions o;
  o.halve_every = 1000;
  LfuPolicy p(3, o);
  p.Admit(10);                       // counts: 10:1
  p.Admit(20);                       // 20:1
  p.Admit(30);                       // 30:1
  EXPECT_EQ(p.ChooseVictim(), 10u);  // equal counts: least recent first
  p.Touch(10);
  p.Touch(10);  // 10:3
  p.Touch(20);  // 20:2
  EXPECT_EQ(p.CountOf(10), 3u);
  EXPECT_EQ(p.CountOf(20), 2u);
  EXPECT_EQ(p.CountOf(30), 1u);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{10, 20, 30}));
  EXPECT_EQ(p.ChooseVictim(), 30u);
  EXPECT_TRUE(p.Remove(30));
  p.Admit(40);  // 40:1
  EXPECT_EQ(p.ChooseVictim(), 40u);
  p.Touch(40);
  p.Touch(40);  // 40:3, counted after 10
  EXPECT_EQ(p.ChooseVictim(), 20u);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{40, 10, 20}));
  // A removed key's count is remembered.
  EXPECT_TRUE(p.Remove(10));
  EXPECT_EQ(p.CountOf(10), 3u);
  p.Admit(10);
  EXPECT_EQ(p.CountOf(10), 4u);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{10, 40, 20}));
}

TEST(LfuPolicy, WithoutHistoryARemovedKeyStartsOver) {
  LfuOptions o;
  o.history_limit = 0;
  LfuPolicy p(2, o);
  p.Admit(1);
  p.Touch(1);
  p.Touch(1);
  EXPECT_TRUE(p.Remove(1));
  EXPECT_EQ(p.CountOf(1), 0u);
  p.Admit(1);
  EXPECT_EQ(p.CountOf(1), 1u);
}

TEST(LfuPolicy, AgeingHalvesCountsAndKeepsOrder) {
  LfuOptions o;
  o.halve_every = 10;
  LfuPolicy p(4, o);
  p.Admit(1);                              // ref 1
  p.Admit(2);                              // ref 2
  p.Admit(3);                              // ref 3
  for (int i = 0; i < 4; ++i) p.Touch(1);  // refs 4-7: 1:5
  p.Touch(2);                              // ref 8: 2:2
  p.Touch(3);                              // ref 9: 3:2, counted after 2
  EXPECT_EQ(p.CountOf(1), 5u);
  p.Touch(3);  // ref 10: 3:3, then everything halves
  EXPECT_EQ(p.CountOf(1), 2u);
  EXPECT_EQ(p.CountOf(2), 1u);
  EXPECT_EQ(p.CountOf(3), 1u);
  // 2 and 3 now share count 1; 2 had the lower count before the halving, so it goes first.
  EXPECT_EQ(p.ChooseVictim(), 2u);
  EXPECT_EQ(p.ResidentKeys(), (std::vector<ExpertKey>{1, 3, 2}));
  // The history ages too.
  EXPECT_TRUE(p.Remove(1));
  EXPECT_EQ(p.CountOf(1), 2u);
  for (int i = 0; i < 10; ++i) p.Touch(3);
  EXPECT_EQ(p.CountOf(1), 1u);
  for (int i = 0; i < 10; ++i) p.Touch(3);
  EXPECT_EQ(p.CountOf(1), 0u);
  EXPECT_EQ(p.history_size(), 0);
}

TEST(LfuPolicy, PrefetchedKeyIsNotCountedAndLeavesFirst) {
  LfuPolicy p(3);
  p.Admit(1);
  p.Admit(2);
  p.AdmitPrefetched(3);
  EXPECT_EQ(p.CountOf(3), 0u);
  EXPECT_EQ(p.ChooseVictim(), 3u);
  p.Touch(3);  // the prefetch was right: it now counts 1, like the others, and is the most recent
  EXPECT_EQ(p.CountOf(3), 1u);
  EXPECT_EQ(p.ChooseVictim(), 1u);
}

TEST(LfuPolicy, PinnedKeysAreSkipped) {
  LfuPolicy p(3);
  p.Admit(1);
  p.Admit(2);
  p.Admit(3);
  p.Touch(3);
  EXPECT_EQ(VictimExcept(p, {1}), 2u);
  EXPECT_EQ(VictimExcept(p, {1, 2}), 3u);
  EXPECT_EQ(VictimExcept(p, {1, 2, 3}), std::nullopt);
}

TEST(ArcPolicy, HandCheckedSequence) {
  ArcPolicy p(2);
  p.Admit(1);
  p.Admit(2);  // T1 = [2, 1]
  EXPECT_EQ(p.t1_size(), 2);
  p.Touch(1);  // T1 = [2], T2 = [1]
  EXPECT_TRUE(p.InT2(1));
  EXPECT_EQ(p.ChooseVictim([](ExpertKey) { return true; }, 3), 2u);  // p = 0 < |T1|: T1 LRU
  EXPECT_TRUE(p.Remove(2));                                          // B1 = [2]
  EXPECT_TRUE(p.IsGhost(2));
  EXPECT_FALSE(p.Contains(2));
  p.Admit(3);  // T1 = [3], T2 = [1], B1 = [2]
  EXPECT_EQ(p.target_t1(), 0);
  // 2 returns: a B1 hit, so T1 should have been larger: p becomes 1 and the victim comes from T2.
  EXPECT_EQ(p.ChooseVictim([](ExpertKey) { return true; }, 2), 1u);
  EXPECT_TRUE(p.Remove(1));  // B2 = [1]
  p.Admit(2);                // ghost hit: T2 = [2]
  EXPECT_EQ(p.target_t1(), 1);
  EXPECT_TRUE(p.InT2(2));
  EXPECT_EQ(p.t1_size(), 1);
  EXPECT_EQ(p.b2_size(), 1);
  EXPECT_EQ(p.b1_size(), 0);
  // 1 returns from B2: p shrinks back to 0; |T1| = 1 > 0, so T1's 3 goes.
  EXPECT_EQ(p.ChooseVictim([](ExpertKey) { return true; }, 1), 3u);
  EXPECT_TRUE(p.Remove(3));
  p.Admit(1);
  EXPECT_EQ(p.target_t1(), 0);
  EXPECT_TRUE(p.InT2(1));
  EXPECT_TRUE(p.InT2(2));
  EXPECT_TRUE(p.IsGhost(3));
}

TEST(ArcPolicy, DirectoryStaysWithinTwiceTheCapacity) {
  ArcPolicy p(4);
  for (ExpertKey k = 0; k < 100; ++k) {
    Lookup(p, k);
    Lookup(p, k % 7);
    EXPECT_LE(p.size(), 4);
    EXPECT_LE(p.t1_size() + p.b1_size(), 4);
    EXPECT_LE(p.size() + p.b1_size() + p.b2_size(), 8);
    EXPECT_GE(p.target_t1(), 0);
    EXPECT_LE(p.target_t1(), 4);
  }
}

TEST(ArcPolicy, PinnedKeysAreSkippedAcrossLists) {
  ArcPolicy p(3);
  p.Admit(1);
  p.Admit(2);
  p.Admit(3);
  p.Touch(3);  // T1 = [2, 1], T2 = [3]
  EXPECT_EQ(VictimExcept(p, {}), 1u);
  EXPECT_EQ(VictimExcept(p, {1}), 2u);
  EXPECT_EQ(VictimExcept(p, {1, 2}), 3u);  // T1 all pinned: T2's LRU
  EXPECT_EQ(VictimExcept(p, {1, 2, 3}), std::nullopt);
}

TEST(ArcPolicy, PrefetchedKeyNeedsTwoReferencesForT2AndLeavesNoGhost) {
  ArcPolicy p(3);
  p.Admit(4);
  p.AdmitPrefetched(5);
  EXPECT_EQ(p.ChooseVictim(), 5u);  // at T1's eviction end until used
  p.Touch(5);                       // the first reference
  EXPECT_EQ(p.ChooseVictim(), 4u);
  EXPECT_FALSE(p.InT2(5));
  p.Touch(5);
  EXPECT_TRUE(p.InT2(5));
  p.AdmitPrefetched(6);
  EXPECT_TRUE(p.Remove(6));
  EXPECT_FALSE(p.IsGhost(6));
  EXPECT_FALSE(p.Contains(6));
}

// Random operations with random pinned sets against a reference set, for every policy.
TEST(AllPolicies, InvariantsUnderRandomOperations) {
  for (const std::string& name : PolicyNames()) {
    for (int64_t capacity : {1, 2, 5, 16}) {
      auto created = CreatePolicy(name, capacity);
      ASSERT_TRUE(created.ok());
      ReplacementPolicy& p = **created;
      std::set<ExpertKey> resident;
      std::mt19937 rng(static_cast<uint32_t>(capacity * 7 + name.size()));
      for (int step = 0; step < 5000; ++step) {
        const ExpertKey key = PackExpertKey(rng() % 4, rng() % 12);
        const int op = rng() % 10;
        if (op == 0) {
          EXPECT_EQ(p.Remove(key), resident.erase(key) == 1);
        } else if (resident.count(key)) {
          p.Touch(key);
        } else {
          std::set<ExpertKey> pinned;
          for (ExpertKey r : resident)
            if (rng() % 3 == 0) pinned.insert(r);
          if (static_cast<int64_t>(resident.size()) == capacity) {
            std::optional<ExpertKey> v = VictimExcept(p, pinned, key);
            if (pinned.size() == resident.size()) {
              EXPECT_FALSE(v.has_value());
              continue;
            }
            ASSERT_TRUE(v.has_value()) << name;
            EXPECT_EQ(pinned.count(*v), 0u) << name << " chose a pinned key";
            EXPECT_EQ(resident.count(*v), 1u) << name << " chose a key that is not resident";
            EXPECT_TRUE(p.Remove(*v));
            resident.erase(*v);
          }
          if (op == 1)
            p.AdmitPrefetched(key);
          else
            p.Admit(key);
          resident.insert(key);
        }
        ASSERT_EQ(p.size(), static_cast<int64_t>(resident.size())) << name;
        ASSERT_LE(p.size(), capacity);
        if (step % 97 == 0) {
          std::vector<ExpertKey> keys = p.ResidentKeys();
          std::sort(keys.begin(), keys.end());
          EXPECT_EQ(keys, std::vector<ExpertKey>(resident.begin(), resident.end())) << name;
          for (ExpertKey k : keys) EXPECT_TRUE(p.Contains(k));
        }
      }
    }
  }
}

// A working set that fits, interrupted by scans of keys used once: LRU lets every scan flush the
// working set; ARC keeps it in T2 and LFU keeps it by count.
TEST(AllPolicies, ScanResistanceOfArcAndLfu) {
  std::vector<ExpertKey> trace;
  for (int round = 0; round < 50; ++round) {
    for (int rep = 0; rep < 4; ++rep)
      for (ExpertKey k = 0; k < 6; ++k) trace.push_back(k);
    for (int s = 0; s < 12; ++s) trace.push_back(1000 + round * 12 + s);  // never seen again
  }
  std::map<std::string, double> rate;
  for (const std::string& name : PolicyNames()) {
    auto p = CreatePolicy(name, 8);
    ASSERT_TRUE(p.ok());
    int hits = 0;
    for (ExpertKey k : trace) hits += Lookup(**p, k);
    rate[name] = static_cast<double>(hits) / trace.size();
  }
  // LRU: the 12-key scan flushes the 6 hot keys every round; 3 of 4 passes over them still hit.
  EXPECT_LT(rate["lru"], 0.52);
  EXPECT_GT(rate["arc"], 0.65);
  EXPECT_GT(rate["lfu"], 0.65);
  EXPECT_GT(rate["arc"], rate["lru"] + 0.1);
  EXPECT_GT(rate["lfu"], rate["lru"] + 0.1);
}

}  // namespace
}  // namespace mer::residency
