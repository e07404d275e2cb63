#include "services/compute/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace mer {
namespace {

const std::vector<float> kLogits = {0.5f, 2.0f, 1.0f, 2.0f, -1.0f, 0.0f};

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(kLogits, {}), 1);
  EXPECT_EQ(Sampler::Argmax(kLogits), 1);
}

TEST(Sampler, PlainArgmaxOnlyWhenGreedyWithoutPenalty) {
  EXPECT_TRUE(Sampler(SamplingParams{}).IsPlainArgmax());
  SamplingParams penalised;
  penalised.repetition_penalty = 1.3f;
  EXPECT_FALSE(Sampler(penalised).IsPlainArgmax());
  SamplingParams warm;
  warm.temperature = 0.7f;
  EXPECT_FALSE(Sampler(warm).IsPlainArgmax());
  // NaNs never win; one at index 0 is kept (nothing compares larger than it).
  const float nan = std::nanf("");
  EXPECT_EQ(Sampler::Argmax(std::vector<float>{1.0f, nan, 3.0f, 3.0f}), 2);
  EXPECT_EQ(Sampler::Argmax(std::vector<float>{nan, 5.0f, 7.0f}), 0);
}

TEST(Sampler, SameSeedSameStreamDifferentSeedDifferentStream) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 42;
  Sampler a(p), b(p);
  p.seed = 43;
  Sampler c(p);
  std::vector<int32_t> sa, sb, sc;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(a.Sample(kLogits, {}));
    sb.push_back(b.Sample(kLogits, {}));
    sc.push_back(c.Sample(kLogits, {}));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  SamplingParams p;
  p.temperature = 5.0f;
  p.top_k = 1;
  Sampler k1(p);
  p.top_k = 0;
  p.top_p = 1e-6f;
  Sampler p0(p);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(k1.Sample(kLogits, {}), 1);
    EXPECT_EQ(p0.Sample(kLogits, {}), 1);
  }
}

TEST(Sampler, TopKRestrictsCandidates) {
  SamplingParams p;
  p.temperature = 10.0f;
  p.top_k = 3;  // ids 1, 3 (2.0) and 2 (1.0)
  p.seed = 1;
  Sampler s(p);
  for (int i = 0; i < 500; ++i) {
    const int32_t id = s.Sample(kLogits, {});
    EXPECT_TRUE(id == 1 || id == 2 || id == 3) << id;
  }
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  Sampler s(p);
  std::map<int32_t, int> counts;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++counts[s.Sample(kLogits, {})];
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    const double want = std::exp(kLogits[i]) / z;
    EXPECT_NEAR(counts[i] / double(n), want, 0.02) << i;  // 20000 draws: sd < 0.004
  }
}

TEST(Sampler, RepetitionPenaltyDiscouragesSeenTokens) {
  SamplingParams p;
  p.repetition_penalty = 4.0f;
  Sampler s(p);
  // 1 and 3 tie at 2.0; penalising 1 (2.0 -> 0.5) leaves 3 the argmax, however often 1 was seen.
  const std::vector<int32_t> history = {1, 1, 1};
  EXPECT_EQ(s.Sample(kLogits, history), 3);
}

TEST(Sampler, ValidatesParams) {
  EXPECT_TRUE(ValidateSamplingParams({}).ok());
  SamplingParams p;
  p.temperature = -0.1f;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = {};
  p.top_p = 0.0f;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.top_p = 1.5f;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = {};
  p.top_k = -1;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
}

// On a real-sized vocabulary, top-k and top-p draws stay inside the set a full sort defines, and
// the unrestricted draw follows the softmax.
TEST(Sampler, LargeVocabularyTruncationMatchesAFullSort) {
  const int n = 30000;
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(gen);
  std::vector<int32_t> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  for (const auto& [top_k, top_p] : std::vector<std::pair<int, float>>{{0, 0.9f}, {50, 1.0f}, {500, 0.5f}}) {
    const float t = 0.7f;
    // The reference candidate set: top-k of the sorted order, then the smallest prefix reaching top_p.
    const int k = top_k > 0 ? top_k : n;
    double z = 0;
    for (int i = 0; i < k; ++i) z += std::exp((logits[order[i]] - logits[order[0]]) / t);
    int keep = k;
    double mass = 0;
    for (int i = 0; i < k && top_p < 1.0f; ++i) {
      mass += std::exp((logits[order[i]] - logits[order[0]]) / t) / z;
      if (mass >= top_p) {
        keep = i + 1;
        break;
      }
    }
    std::set<int32_t> allowed(order.begin(), order.begin() + keep);
    SamplingParams p;
    p.temperature = t;
    p.top_k = top_k;
    p.top_p = top_p;
    p.seed = 3;
    Sampler s(p);
    std::set<int32_t> seen;
    for (int i = 0; i < 300; ++i) {
      const int32_t id = s.Sample(logits, {});
      ASSERT_TRUE(allowed.count(id)) << "top_k " << top_k << " top_p " << top_p << ": " << id;
      seen.insert(id);
    }
    EXPECT_GT(seen.size(), 1u);
  }
  // Unrestricted: the most likely token's frequency is its softmax probability.
  SamplingParams p;
  p.temperature = 0.5f;
  p.seed = 4;
  Sampler s(p);
  double z = 0;
  for (float l : logits) z += std::exp((l - logits[order[0]]) / 0.5f);
  const double want = 1.0 / z;
  int hits = 0;
  const int draws = 5000;
  for (int i = 0; i < draws; ++i) hits += s.Sample(logits, {}) == order[0];
  EXPECT_NEAR(hits / double(draws), want, 5 * std::sqrt(want / draws) + 1e-3);
}

// kLogits with a temperature of 1: p(1) = p(3) = e^2 / Z, p(2) = e / Z, so min_p = 0.5 keeps 1
// and 3 only (e / e^2 = 0.37), with or without top-k (both sampling paths).
TEST(Sampler, MinPDropsTokensBelowAFractionOfTheTopOne) {
  for (int top_k : {0, 5}) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.min_p = 0.5f;
    p.top_k = top_k;
    Sampler s(p);
    std::set<int32_t> seen;
    for (int i = 0; i < 400; ++i) seen.insert(s.Sample(kLogits, {}));
    EXPECT_EQ(seen, (std::set<int32_t>{1, 3})) << "top_k " << top_k;
  }
}

TEST(Sampler, LogitBiasForcesAndBansTokens) {
  SamplingParams p;
  p.logit_bias = {{4, 100.0f}};
  Sampler forced(p);
  EXPECT_FALSE(forced.IsPlainArgmax());
  EXPECT_EQ(forced.Sample(kLogits, {}), 4);
  p.logit_bias = {{1, -100.0f}};
  Sampler banned(p);
  EXPECT_EQ(banned.Sample(kLogits, {}), 3);  // the other 2.0
}

// Presence subtracts once per distinct generated token, frequency once per occurrence; the prompt
// (history) does not count.
TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  SamplingParams p;
  p.presence_penalty = 0.6f;  // 2.0 - 0.6 = 1.4 > 1.0: the second 2.0 comes next, then 2 (1.0)
  Sampler presence(p);
  const std::vector<int32_t> prompt = {1, 1, 3};
  EXPECT_EQ(presence.Sample(kLogits, prompt), 1);
  EXPECT_EQ(presence.Sample(kLogits, prompt), 3);
  EXPECT_EQ(presence.Sample(kLogits, prompt), 1);  // 1.4 each: lowest id
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.6f;
  Sampler frequency(p);
  EXPECT_EQ(frequency.Sample(kLogits, prompt), 1);  // 2.0 - 0 x 0.6
  EXPECT_EQ(frequency.Sample(kLogits, prompt), 3);
  EXPECT_EQ(frequency.Sample(kLogits, prompt), 1);  // 1.4 vs 1.4
  EXPECT_EQ(frequency.Sample(kLogits, prompt), 3);
  EXPECT_EQ(frequency.Sample(kLogits, prompt), 2);  // 1.0 > 0.8
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  double z = 0;
  for (float v : kLogits) z += std::exp(static_cast<double>(v));
  TokenLogprobs lp;
  Sampler::Logprobs(kLogits, 2, 3, &lp);
  EXPECT_NEAR(lp.logprob, 1.0 - std::log(z), 1e-6);
  EXPECT_EQ(lp.top_ids, (std::vector<int32_t>{1, 3, 2}));  // ties: lower id first
  ASSERT_EQ(lp.top_logprobs.size(), 3u);
  EXPECT_NEAR(lp.top_logprobs[0], 2.0 - std::log(z), 1e-6);
  EXPECT_NEAR(lp.top_logprobs[2], 1.0 - std::log(z), 1e-6);
  Sampler::Logprobs(kLogits, 4, 0, &lp);
  EXPECT_TRUE(lp.top_ids.empty());
  EXPECT_NEAR(lp.logprob, -1.0 - std::log(z), 1e-6);
  Sampler::Logprobs(kLogits, 0, 20, &lp);  // more than the vocabulary: all of it, in order
  EXPECT_EQ(lp.top_ids, (std::vector<int32_t>{1, 3, 2, 0, 5, 4}));
}

TEST(Sampler, ValidatesTheNewKnobs) {
  SamplingParams p;
  p.min_p = 1.5f;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = {};
  p.presence_penalty = -2.5f;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = {};
  p.frequency_penalty = 3.0f;
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p = {};
  p.logit_bias = {{3, 101.0f}};
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_EQ(ValidateSamplingParams(p).code(), absl::StatusCode::kInvalidArgument);
  p.logit_bias = {{3, -100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

}  // namespace
}  // namespace mer
