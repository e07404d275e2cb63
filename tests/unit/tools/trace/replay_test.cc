#include "tools/trace/replay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "services/residency/policy/replacement_policy.h"

namespace mer::trace {
namespace {

using residency::PolicyNames;

// A trace of decode tokens, one id list [layer][top_k] per token.
RoutingTrace DecodeTrace(const TraceGeometry& g, const std::vector<std::vector<int32_t>>& tokens) {
  RoutingTrace t(g);
  for (const auto& ids : tokens) EXPECT_TRUE(t.AddRecord(TracePhase::kDecode, 1, ids).ok());
  return t;
}

// Zipf-like routing: at each layer expert popularity ranks are permuted, the expert of rank r has
// weight 1 / (r + 1)^skew, and a token draws top_k distinct experts by weight.
RoutingTrace SkewedTrace(int n_layer, int n_expert, int top_k, int tokens, double skew, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> perm(n_layer, std::vector<int32_t>(n_expert));
  for (auto& p : perm) {
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
  }
  RoutingTrace t(TraceGeometry{n_layer, n_expert, top_k, 1 << 20});
  std::vector<int32_t> ids;
  for (int i = 0; i < tokens; ++i) {
    ids.clear();
    for (int l = 0; l < n_layer; ++l) {
      std::vector<double> w(n_expert);
      for (int r = 0; r < n_expert; ++r) w[r] = 1.0 / std::pow(r + 1.0, skew);
      for (int j = 0; j < top_k; ++j) {
        std::discrete_distribution<int> d(w.begin(), w.end());
        const int r = d(rng);
        w[r] = 0;
        ids.push_back(perm[l][r]);
      }
    }
    EXPECT_TRUE(t.AddRecord(TracePhase::kDecode, 1, ids).ok());
  }
  return t;
}

// Belady's MIN, 2 slots, 1 layer x 4 experts, top-1, lookups 0 1 2 0 1 3 0 1:
//   0 miss, 1 miss; 2 miss, evicts 1 (next used at step 4, 0 at step 3); 0 hit; 1 miss, evicts 2
//   (never used again); 3 miss, evicts 1 (next at 7, 0 at 6); 0 hit; 1 miss. 6 misses; LRU has 8.
TEST(Replay, HandCheckedBeladyBound) {
  const RoutingTrace t = DecodeTrace({1, 4, 1, 1000}, {{0}, {1}, {2}, {0}, {1}, {3}, {0}, {1}});
  ReplayOptions o;
  o.slots = 2;
  o.policy = "opt";
  auto s = Replay(t, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->lookups, 8);
  EXPECT_EQ(s->misses, 6);
  o.policy = "lru";
  EXPECT_EQ(Replay(t, o)->misses, 8);
  o.policy = "opt";
  o.prefetch = true;
  EXPECT_EQ(Replay(t, o).status().code(), absl::StatusCode::kInvalidArgument);
}

// No policy misses less than the bound, and on skewed routing the bound is well below them all.
TEST(Replay, NoPolicyBeatsTheBeladyBound) {
  const RoutingTrace t = SkewedTrace(8, 32, 4, 300, 0.675, 5);
  for (double fraction : {0.125, 0.25, 0.5}) {
    ReplayOptions o;
    o.slots = SlotsForFraction(t.geometry(), fraction);
    o.policy = "opt";
    const ReplayStats bound = *Replay(t, o);
    EXPECT_GT(bound.misses, 0);
    for (const std::string& p : PolicyNames()) {
      for (bool prefetch : {false, true}) {
        o.policy = p;
        o.prefetch = prefetch;
        const ReplayStats s = *Replay(t, o);
        EXPECT_GE(s.misses, bound.misses) << p << " " << fraction << " " << prefetch;
        if (!prefetch) {
          EXPECT_GT(s.misses, bound.misses) << p << " " << fraction;
        }
      }
    }
  }
}

TEST(Replay, SlotsForFraction) {
  const TraceGeometry small{12, 32, 4, 0};
  EXPECT_EQ(SlotsForFraction(small, 0.125), 48);
  EXPECT_EQ(SlotsForFraction(small, 0.25), 96);
  EXPECT_EQ(SlotsForFraction(small, 0.5), 192);
  EXPECT_EQ(SlotsForFraction(small, 1.0), 384);
  EXPECT_EQ(SlotsForFraction(small, 0.0001), 1);
}

// LRU, 2 slots, 2 layers x 4 experts, top-1:
//   token 0: (0,0) miss, (1,1) miss                      cache (1,1) (0,0)
//   token 1: (0,0) hit,  (1,2) miss, evicts (1,1)        cache (1,2) (0,0)
//   token 2: (0,1) miss, evicts (0,0); (1,2) hit         cache (1,2) (0,1)
TEST(Replay, HandCheckedLru) {
  const RoutingTrace t = DecodeTrace({2, 4, 1, 1000}, {{0, 1}, {0, 2}, {1, 2}});
  ReplayOptions o;
  o.slots = 2;
  o.policy = "lru";
  auto s = Replay(t, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->lookups, 6);
  EXPECT_EQ(s->hits, 2);
  EXPECT_EQ(s->misses, 4);
  EXPECT_EQ(s->bypassed, 0);
  EXPECT_EQ(s->tokens, 3);
  EXPECT_EQ(s->demand_bytes, 4000);
  EXPECT_EQ(s->bytes_read(), 4000);
  EXPECT_NEAR(s->hit_rate(), 2.0 / 6, 1e-12);
  EXPECT_NEAR(s->stall_seconds, 4 * 100e-6 + 4000 / 1.5e9, 1e-12);
  // Parameters of the stall model, and the expert size override.
  o.latency_us = 0;
  o.bandwidth_gbps = 1;
  o.expert_bytes = 1'000'000;
  s = Replay(t, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->demand_bytes, 4'000'000);
  EXPECT_NEAR(s->stall_seconds, 4e-3, 1e-12);
}

TEST(Replay, DistinctExpertsOfABatchAreOneLookupEach) {
  RoutingTrace t(TraceGeometry{1, 4, 2, 10});
  // Two tokens both routed to 0 and 1: the layer needs two experts.
  ASSERT_TRUE(t.AddRecord(TracePhase::kPrompt, 2, {0, 1, 1, 0}).ok());
  ASSERT_TRUE(t.AddRecord(TracePhase::kDecode, 1, {1, 2}).ok());
  ReplayOptions o;
  o.slots = 4;
  auto s = Replay(t, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->lookups, 4);
  EXPECT_EQ(s->hits, 1);
  o.count_prompt = false;  // the prompt warms the cache but is not counted
  s = Replay(t, o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->lookups, 2);
  EXPECT_EQ(s->hits, 1);
  EXPECT_EQ(s->tokens, 1);
}

// One slot, two experts per layer step: both are pinned while the layer runs, so the second miss
// of a step cannot evict the first and is read without being cached.
TEST(Replay, PinnedExpertsAreNeverEvicted) {
  const RoutingTrace t = DecodeTrace({1, 4, 2, 10}, {{0, 1}, {0, 1}, {0, 1}});
  for (const std::string& policy : PolicyNames()) {
    ReplayOptions o;
    o.slots = 1;
    o.policy = policy;
    auto s = Replay(t, o);
    ASSERT_TRUE(s.ok()) << policy;
    EXPECT_EQ(s->lookups, 6) << policy;
    EXPECT_EQ(s->hits, 2) << policy;  // expert 0 stays
    EXPECT_EQ(s->bypassed, 3) << policy;
    EXPECT_EQ(s->misses, 4) << policy;
  }
}

// A deterministic cycle of four routings per layer, too long for LRU in 4 slots (reuse distance
// 16 keys): no demand hits at all, but once learnt the predictor names every next layer exactly.
TEST(Replay, PrefetchOfADeterministicCycle) {
  std::vector<std::vector<int32_t>> tokens;
  for (int t = 0; t < 400; ++t) {
    const int p = t % 4;
    tokens.push_back({2 * p, 2 * p + 1, (2 * p + 2) % 8, (2 * p + 3) % 8});
  }
  const RoutingTrace trace = DecodeTrace({2, 8, 2, 1000}, tokens);
  ReplayOptions o;
  o.slots = 4;
  o.policy = "lru";
  auto off = Replay(trace, o);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->hits, 0);
  o.prefetch = true;
  o.confidence = 0.5;
  o.prefetch_budget = 2;
  auto on = Replay(trace, o);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_GT(on->hit_rate(), 0.95);
  EXPECT_EQ(on->lookups, off->lookups);
  EXPECT_EQ(on->prefetch_issued, on->prefetch_useful + on->prefetch_wasted);
  EXPECT_GT(on->prefetch_useful, 0.95 * on->prefetch_issued);
  EXPECT_EQ(on->prefetch_bytes, on->prefetch_issued * 1000);
  EXPECT_EQ(on->bytes_read(), on->demand_bytes + on->prefetch_bytes);
  EXPECT_LT(on->stall_seconds, 0.1 * off->stall_seconds);
  // A budget of one read per step halves what prefetch can cover.
  o.prefetch_budget = 1;
  auto one = Replay(trace, o);
  ASSERT_TRUE(one.ok());
  EXPECT_LE(one->prefetch_issued, 800);
  EXPECT_LT(one->hit_rate(), 0.55);
  EXPECT_GT(one->hit_rate(), 0.45);
  // A threshold above every confidence issues nothing.
  o.confidence = 1.0;
  o.predictor.use_reuse = false;
  auto none = Replay(DecodeTrace({2, 8, 2, 1000}, {{0, 1, 2, 3}, {0, 1, 2, 4}, {0, 1, 2, 5}}), o);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->prefetch_issued, 0);
}

// Demand goes first: when the layer in flight pins every slot, a prefetch finds no victim.
TEST(Replay, PrefetchNeverEvictsTheLayerInFlight) {
  std::vector<std::vector<int32_t>> tokens;
  for (int t = 0; t < 100; ++t) tokens.push_back({0, 1, 2, 3});
  const RoutingTrace trace = DecodeTrace({2, 8, 2, 1000}, tokens);
  ReplayOptions o;
  o.slots = 2;
  o.prefetch = true;
  o.confidence = 0.1;
  for (const std::string& policy : PolicyNames()) {
    o.policy = policy;
    auto s = Replay(trace, o);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->prefetch_issued, 0) << policy;
    EXPECT_EQ(s->bypassed, 0) << policy;
  }
}

// Layer 2 alternates between {4, 5} and {6, 7}; layers 0 and 1 never change. Prefetching the
// certain guesses must not cost demand hits (a prefetch for layer L takes another layer's slot,
// or one of L's experts the prediction does not name, never the predicted resident ones).
TEST(Replay, PrefetchDoesNotCostDemandHits) {
  std::vector<std::vector<int32_t>> tokens;
  for (int t = 0; t < 60; ++t) tokens.push_back({0, 1, 2, 3, t % 2 ? 6 : 4, t % 2 ? 7 : 5});
  const RoutingTrace trace = DecodeTrace({3, 8, 2, 1000}, tokens);
  ReplayOptions o;
  o.slots = 6;
  o.prefetch = true;
  o.confidence = 0.4;
  o.predictor.use_reuse = false;
  for (const std::string& policy : PolicyNames()) {
    o.policy = policy;
    auto s = Replay(trace, o);
    ASSERT_TRUE(s.ok());
    auto off = o;
    off.prefetch = false;
    auto base = Replay(trace, off);
    ASSERT_TRUE(base.ok());
    EXPECT_GE(s->hits, base->hits) << policy;
    EXPECT_GT(s->prefetch_issued, 0) << policy;
    std::printf("%s: hits %lld without prefetch, %lld with (%lld issued, %lld useful)\n", policy.c_str(),
                static_cast<long long>(base->hits), static_cast<long long>(s->hits),
                static_cast<long long>(s->prefetch_issued), static_cast<long long>(s->prefetch_useful));
  }
}

TEST(Replay, OptionErrors) {
  const RoutingTrace t = DecodeTrace({1, 4, 1, 0}, {{0}});
  ReplayOptions o;
  o.slots = 2;
  EXPECT_EQ(Replay(t, o).status().code(), absl::StatusCode::kInvalidArgument);  // no expert size
  o.expert_bytes = 10;
  EXPECT_TRUE(Replay(t, o).ok());
  o.policy = "mru";
  EXPECT_FALSE(Replay(t, o).ok());
  o.policy = "arc";
  o.slots = 0;
  EXPECT_FALSE(Replay(t, o).ok());
  o.slots = 2;
  o.bandwidth_gbps = 0;
  EXPECT_FALSE(Replay(t, o).ok());
  o.bandwidth_gbps = 1.5;
  o.confidence = 1.5;
  EXPECT_FALSE(Replay(t, o).ok());
  o.confidence = 0.3;
  o.prefetch_budget = -1;
  EXPECT_FALSE(Replay(t, o).ok());
}

// Zipf-like routing (what --router-skew gives): the frequency-aware policies keep the popular
// experts of every layer, where LRU keeps whatever the last few tokens used.
TEST(Replay, FrequencyAwarePoliciesBeatLruOnSkewedRouting) {
  const RoutingTrace trace = SkewedTrace(12, 32, 4, 1500, 1.0, 42);
  std::map<std::string, double> rate;
  for (const std::string& policy : PolicyNames()) {
    ReplayOptions o;
    o.slots = SlotsForFraction(trace.geometry(), 0.25);
    o.policy = policy;
    auto s = Replay(trace, o);
    ASSERT_TRUE(s.ok());
    rate[policy] = s->hit_rate();
  }
  RecordProperty("lru", std::to_string(rate["lru"]));
  RecordProperty("lfu", std::to_string(rate["lfu"]));
  RecordProperty("arc", std::to_string(rate["arc"]));
  std::printf("hit rate at 25%%: lru %.3f lfu %.3f arc %.3f\n", rate["lru"], rate["lfu"], rate["arc"]);
  EXPECT_GT(rate["lfu"], rate["lru"] + 0.05);
  EXPECT_GT(rate["arc"], rate["lru"]);
}

// Uniform routing: no policy can do better than the cached fraction. Within one layer every policy
// gets about that; over many layers visited in turn, recency-ordered victims come from the layer
// used longest ago, which is the one needed next, so the policies fall below it.
TEST(Replay, UniformRoutingGivesAtMostTheCachedFraction) {
  const RoutingTrace one_layer = SkewedTrace(1, 128, 4, 3000, 0.0, 7);
  const RoutingTrace layers = SkewedTrace(12, 32, 4, 1000, 0.0, 7);
  for (const std::string& policy : PolicyNames()) {
    ReplayOptions o;
    o.policy = policy;
    o.slots = 32;
    auto s = Replay(one_layer, o);
    ASSERT_TRUE(s.ok());
    EXPECT_NEAR(s->hit_rate(), 0.25, 0.02) << policy;
    o.slots = SlotsForFraction(layers.geometry(), 0.25);
    s = Replay(layers, o);
    ASSERT_TRUE(s.ok());
    std::printf("uniform, 12 layers, 25%% of experts: %s %.3f\n", policy.c_str(), s->hit_rate());
    EXPECT_LT(s->hit_rate(), 0.26) << policy;
    EXPECT_GT(s->hit_rate(), 0.15) << policy;
  }
}

}  // namespace
}  // namespace mer::trace
