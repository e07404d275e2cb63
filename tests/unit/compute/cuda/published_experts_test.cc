// The device path's host bookkeeping: the published-experts table and its retirement order, and
// the reading end of the routing-record ring (written here the way the device writes it).
#include "services/compute/cuda/published_experts.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "services/compute/cuda/routing_record.h"

namespace mer::cuda {
namespace {

TEST(PublishedExperts, LruRetiresTheLeastRecentlyUsedOutsideTheWaitingLayer) {
  PublishedExperts p(3, 8, ArenaPolicy::kLru);
  for (int l = 0; l < 3; ++l)
    for (int e = 0; e < 4; ++e) p.Publish(l, e, l * 4 + e);
  EXPECT_EQ(p.published(), 12);
  const int32_t l0[] = {0, 1, 2, 3}, l1[] = {0, 1}, l2[] = {2, 3};
  p.Used(0, l0, 4, 10);
  p.Used(1, l1, 2, 11);
  p.Used(2, l2, 2, 12);
  // Never used: (1, 2), (1, 3), (2, 0), (2, 1) are the oldest; layer 2's experts 0 and 1 are
  // what the waiting step needs, so they stay.
  std::vector<int64_t> out;
  const int32_t keep[] = {0, 1};
  p.ChooseRetirees(3, 2, keep, 2, &out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], 1 * 8 + 2);
  EXPECT_EQ(out[1], 1 * 8 + 3);
  EXPECT_EQ(out[2], 0 * 8 + 0);  // then the oldest used (step 10), lowest key first
  p.Unpublish(1, 2);
  EXPECT_EQ(p.slot(1, 2), -1);
  EXPECT_EQ(p.published(), 11);
  EXPECT_EQ(p.row(2)[3], 11);
  p.Clear();
  EXPECT_EQ(p.published(), 0);
  out.clear();
  p.ChooseRetirees(5, 0, nullptr, 0, &out);
  EXPECT_TRUE(out.empty());
}

TEST(PublishedExperts, LfuRetiresTheLeastOftenUsedThenTheLeastRecentlyUsed) {
  PublishedExperts p(2, 8, ArenaPolicy::kLfu, /*capacity=*/64);
  for (int e = 0; e < 5; ++e) p.Publish(0, e, e);
  const int32_t hot[] = {0}, warm[] = {1, 2}, late[] = {2, 4};
  for (uint32_t step = 1; step <= 5; ++step) p.Used(0, hot, 1, step);
  p.Used(0, warm, 2, 6);
  p.Used(0, late, 2, 7);
  // Counts: expert 0 five (last used at step 5), 2 two, 1 and 4 one (steps 6 and 7), 3 none.
  std::vector<int64_t> out;
  p.ChooseRetirees(4, 1, nullptr, 0, &out);
  EXPECT_EQ(out, (std::vector<int64_t>{3, 1, 4, 2}));
  // Keeping the waiting layer's experts: layer 0's 3 and 1 stay; expert 0, used most, goes last.
  out.clear();
  const int32_t keep[] = {3, 1};
  p.ChooseRetirees(4, 0, keep, 2, &out);
  EXPECT_EQ(out, (std::vector<int64_t>{4, 2, 0}));
  // An expert that is not published keeps its count: published again, it resumes it.
  p.Unpublish(0, 0);
  EXPECT_EQ(p.uses(0, 0), 5u);
  EXPECT_EQ(p.uses(1, 0), 0u);
}

TEST(PublishedExperts, LfuHalvesEveryCountEvery16TimesCapacityUses) {
  PublishedExperts p(1, 4, ArenaPolicy::kLfu, /*capacity=*/1);  // halves every 16 uses
  const int32_t a[] = {0}, b[] = {1};
  for (uint32_t step = 1; step <= 6; ++step) p.Used(0, b, 1, step);
  for (uint32_t step = 7; step <= 20; ++step) p.Used(0, a, 1, step);
  // The 16th use (expert 0's tenth) halved 6 -> 3 and 10 -> 5; four more uses of expert 0 since.
  EXPECT_EQ(p.uses(0, 1), 3u);
  EXPECT_EQ(p.uses(0, 0), 9u);
}

// Writes a record the way miss_post.cu does: the lists, the header, then `ready`.
void Post(std::vector<uint8_t>& ring, int cap, int bytes, int n_expert, uint64_t position, uint32_t layer,
          const std::vector<int32_t>& used, uint32_t n_missing) {
  uint8_t* rec = ring.data() + int64_t(position % cap) * bytes;
  std::memcpy(RecordUsed(rec), used.data(), used.size() * 4);
  RoutingRecordHeader h{};
  h.layer = layer;
  h.step = static_cast<uint32_t>(position / 4);
  h.n_used = static_cast<uint32_t>(used.size());
  h.n_missing = n_missing;
  h.ready = position + 1;
  std::memcpy(rec, &h, sizeof h);
}

TEST(RoutingRecordReader, ReadsInOrderSkipsALostLapAndDropsMalformedRecords) {
  const int n_expert = 16, k = 4, cap = 4;
  const int bytes = RoutingRecordBytes(n_expert, k);
  EXPECT_EQ(bytes % 64, 0);
  std::vector<uint8_t> ring(int64_t(cap) * bytes, 0);
  RoutingRecordReader r(ring.data(), cap, bytes, /*n_layer=*/8, n_expert, k);
  RoutingRecord rec;
  EXPECT_FALSE(r.Next(&rec));
  Post(ring, cap, bytes, n_expert, 0, 3, {1, 5, 9}, 1);
  ASSERT_TRUE(r.Next(&rec));
  EXPECT_EQ(rec.position, 0u);
  EXPECT_EQ(rec.header.layer, 3u);
  EXPECT_EQ(rec.used, (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(rec.header.n_missing, 1u);
  EXPECT_FALSE(r.Next(&rec));
  // Six more: the reader is more than a lap behind; it resumes at the newest in its slot.
  for (uint64_t p = 1; p <= 6; ++p) Post(ring, cap, bytes, n_expert, p, uint32_t(p % 8), {int32_t(p)}, 0);
  ASSERT_TRUE(r.Next(&rec));
  EXPECT_EQ(rec.position, 5u);  // slot 1 holds position 5; positions 1..4 were lost
  EXPECT_EQ(r.skipped(), 4u);
  ASSERT_TRUE(r.Next(&rec));
  EXPECT_EQ(rec.position, 6u);
  EXPECT_FALSE(r.Next(&rec));
  // A layer out of range (the device wrote nonsense): dropped and counted, not returned.
  Post(ring, cap, bytes, n_expert, 7, 99, {1}, 0);
  Post(ring, cap, bytes, n_expert, 8, 2, {2}, 0);
  ASSERT_TRUE(r.Next(&rec));
  EXPECT_EQ(rec.position, 8u);
  EXPECT_EQ(r.malformed(), 1u);
}

}  // namespace
}  // namespace mer::cuda
