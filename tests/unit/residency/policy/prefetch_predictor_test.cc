#include "services/residency/policy/prefetch_predictor.h"

#include <gtest/gtest.h>

#include <random>

namespace mer::residency {
namespace {

std::vector<int32_t> Ids(const std::vector<ExpertPrediction>& p) {
  std::vector<int32_t> ids;
  for (const auto& x : p) ids.push_back(x.expert);
  return ids;
}

// Layer 0 always {0, 1}, layer 1 always {2, 3}: after a few tokens both are certain.
TEST(PrefetchPredictor, LearnsADeterministicChain) {
  PrefetchPredictor p(2, 8);
  std::vector<ExpertPrediction> out;
  p.Observe(0, {0, 1});
  p.Predict(1, 0.1, 8, &out);
  EXPECT_TRUE(out.empty());  // nothing learnt yet
  for (int t = 0; t < 5; ++t) {
    if (t > 0) p.Observe(0, {0, 1});
    p.Observe(1, {2, 3});
  }
  p.Observe(0, {0, 1});
  p.Predict(1, 0.5, 8, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{2, 3}));
  EXPECT_FLOAT_EQ(out[0].confidence, 1.0f);
  EXPECT_DOUBLE_EQ(p.TransitionShare(1, 2), 1.0);
  EXPECT_DOUBLE_EQ(p.TransitionShare(1, 5), 0.0);
  // Layer 0 of the next token follows layer 1 of this one (the wrap-around transition).
  p.Observe(1, {2, 3});
  p.Predict(0, 0.5, 8, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{0, 1}));
}

TEST(PrefetchPredictor, ConfidenceIsTheCountShareAndThresholdAndBudgetApply) {
  PrefetchPredictor p(2, 8);
  // After {0, 1} at layer 0, layer 1 uses {2, 3} three times out of four and {2, 4} once.
  for (int t = 0; t < 40; ++t) {
    p.Observe(0, {0, 1});
    p.Observe(1, t % 4 == 3 ? std::vector<int32_t>{2, 4} : std::vector<int32_t>{2, 3});
  }
  p.Observe(0, {0, 1});
  std::vector<ExpertPrediction> out;
  p.Predict(1, 0.0, 8, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{2, 3, 4}));
  EXPECT_NEAR(out[0].confidence, 1.0, 1e-6);
  EXPECT_NEAR(out[1].confidence, 0.75, 1e-6);
  EXPECT_NEAR(out[2].confidence, 0.25, 1e-6);
  p.Predict(1, 0.5, 8, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{2, 3}));
  p.Predict(1, 0.0, 1, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{2}));
  p.Predict(1, 0.0, 0, &out);
  EXPECT_TRUE(out.empty());
}

TEST(PrefetchPredictor, SourcesArePooled) {
  PrefetchPredictor p(2, 8);
  // {0, 1} -> {4, 5};  {2, 3} -> {6, 7}.
  for (int t = 0; t < 20; ++t) {
    const bool a = t % 2 == 0;
    p.Observe(0, a ? std::vector<int32_t>{0, 1} : std::vector<int32_t>{2, 3});
    p.Observe(1, a ? std::vector<int32_t>{4, 5} : std::vector<int32_t>{6, 7});
  }
  std::vector<ExpertPrediction> out;
  p.Observe(0, {2, 3});
  p.Predict(1, 0.9, 8, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{6, 7}));
  // A mixed source splits the share.
  p.Observe(1, {6, 7});
  p.Observe(0, {0, 3});
  EXPECT_NEAR(p.TransitionShare(1, 4), 0.5, 0.05);
  EXPECT_NEAR(p.TransitionShare(1, 7), 0.5, 0.05);
}

TEST(PrefetchPredictor, ReuseFromThePreviousToken) {
  PrefetchPredictorOptions o;
  o.use_transitions = false;
  PrefetchPredictor p(1, 8, o);
  // Expert 3 always comes back; the other slot changes every token.
  for (int t = 0; t < 30; ++t) p.Observe(0, {3, t % 2 == 0 ? 5 : 6});
  EXPECT_DOUBLE_EQ(p.ReuseShare(0, 3), 1.0);
  EXPECT_DOUBLE_EQ(p.ReuseShare(0, 5), 0.0);
  std::vector<ExpertPrediction> out;
  p.Predict(0, 0.5, 8, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{3}));
}

TEST(PrefetchPredictor, NeedsMinimumObservations) {
  PrefetchPredictorOptions o;
  o.min_observations = 10;
  PrefetchPredictor p(2, 4, o);
  std::vector<ExpertPrediction> out;
  for (int t = 0; t < 4; ++t) {
    p.Observe(0, {0});
    p.Observe(1, {1});
  }
  p.Observe(0, {0});
  p.Predict(1, 0.1, 4, &out);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(p.TransitionShare(1, 1), -1);
  for (int t = 0; t < 10; ++t) {
    p.Observe(1, {1});
    p.Observe(0, {0});
  }
  p.Predict(1, 0.1, 4, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{1}));
}

TEST(PrefetchPredictor, AgeingFollowsDrift) {
  PrefetchPredictorOptions o;
  o.count_limit = 64;
  PrefetchPredictor p(2, 4, o);
  for (int t = 0; t < 1000; ++t) {
    p.Observe(0, {0});
    p.Observe(1, {1});
  }
  for (int t = 0; t < 200; ++t) {
    p.Observe(0, {0});
    p.Observe(1, {2});
  }
  p.Observe(0, {0});
  std::vector<ExpertPrediction> out;
  p.Predict(1, 0.9, 4, &out);
  EXPECT_EQ(Ids(out), (std::vector<int32_t>{2}));
}

TEST(PrefetchPredictor, ResetForgets) {
  PrefetchPredictor p(2, 4);
  for (int t = 0; t < 10; ++t) {
    p.Observe(0, {0});
    p.Observe(1, {1});
  }
  p.Reset();
  p.Observe(0, {0});
  std::vector<ExpertPrediction> out;
  p.Predict(1, 0.0, 4, &out);
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace mer::residency
