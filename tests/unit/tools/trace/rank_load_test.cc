#include "tools/trace/rank_load.h"

#include <gtest/gtest.h>

#include <vector>

namespace mer::trace {
namespace {

// One layer of 8 experts, top-2: tokens {0, 1}, {0, 2}, {2, 4} as decode records, then a prompt
// record that only --prompt counts.
RoutingTrace SmallTrace() {
  RoutingTrace t(TraceGeometry{1, 8, 2, 1000});
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{0, 1}, {0, 2}, {2, 4}})
    EXPECT_TRUE(t.AddRecord(TracePhase::kDecode, 1, ids).ok());
  EXPECT_TRUE(t.AddRecord(TracePhase::kPrompt, 2, {6, 7, 5, 3}).ok());
  return t;
}

// Two ranks (even experts on rank 0): the busiest rank runs 1, 2 and 2 pairs of the three tokens'
// 6, so the expert work goes 6 / 5 = 1.2x faster than on one rank. Replicating the most used
// expert (0, used twice like 2, and the lower id) gives token 0's expert 0 to rank 0 beside rank 1's
// expert 1, token 1's to rank 1 beside rank 0's expert 2: busiest 1, 1, 2, so 1.5x.
TEST(RankLoad, HandChecked) {
  const RoutingTrace t = SmallTrace();
  RankLoadOptions o;
  o.n_ranks = 2;
  RankLoadStats s = *RankLoad(t, o);
  EXPECT_EQ(s.layer_steps, 3);
  EXPECT_EQ(s.pairs, 6);
  EXPECT_EQ(s.busiest_pairs, 5);
  EXPECT_DOUBLE_EQ(s.speedup(), 1.2);
  EXPECT_DOUBLE_EQ(s.efficiency(), 0.6);
  o.replicate_per_layer = 1;
  s = *RankLoad(t, o);
  EXPECT_EQ(s.busiest_pairs, 4);
  EXPECT_DOUBLE_EQ(s.speedup(), 1.5);
  // The prompt record's 4 pairs: experts 6 (rank 0), 7, 5, 3 (rank 1): busiest 3.
  o.replicate_per_layer = 0;
  o.count_prompt = true;
  s = *RankLoad(t, o);
  EXPECT_EQ(s.pairs, 10);
  EXPECT_EQ(s.busiest_pairs, 8);
}

TEST(RankLoad, OneRankAndEveryExpertReplicatedAreEven) {
  const RoutingTrace t = SmallTrace();
  RankLoadOptions o;
  o.n_ranks = 1;
  EXPECT_DOUBLE_EQ(RankLoad(t, o)->speedup(), 1.0);
  o.n_ranks = 2;
  o.replicate_per_layer = 8;  // every expert on both ranks: each token's 2 pairs split 1 / 1
  EXPECT_DOUBLE_EQ(RankLoad(t, o)->speedup(), 2.0);
}

TEST(RankLoad, OptionErrors) {
  const RoutingTrace t = SmallTrace();
  RankLoadOptions o;
  o.n_ranks = 0;
  EXPECT_EQ(RankLoad(t, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.n_ranks = 2;
  o.replicate_per_layer = 9;
  EXPECT_EQ(RankLoad(t, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.replicate_per_layer = -1;
  EXPECT_EQ(RankLoad(t, o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mer::trace
