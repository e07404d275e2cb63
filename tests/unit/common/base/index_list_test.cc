#include "common/base/index_list.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <list>
#include <random>
#include <vector>

namespace mer {
namespace {

struct Node {
  uint32_t prev = kNilIndex;
  uint32_t next = kNilIndex;
};

// Front to back, following `next`; and back to front, following `prev`, reversed: both must agree.
std::vector<uint32_t> Forward(const IndexList<Node>& l, const std::vector<Node>& pool) {
  std::vector<uint32_t> out;
  for (uint32_t i = l.front(); i != kNilIndex; i = pool[i].next) out.push_back(i);
  return out;
}
std::vector<uint32_t> Backward(const IndexList<Node>& l, const std::vector<Node>& pool) {
  std::vector<uint32_t> out;
  for (uint32_t i = l.back(); i != kNilIndex; i = pool[i].prev) out.push_back(i);
  std::reverse(out.begin(), out.end());
  return out;
}

TEST(IndexListTest, EmptyAndOne) {
  std::vector<Node> pool(1);
  IndexList<Node> l;
  EXPECT_TRUE(l.empty());
  EXPECT_EQ(l.front(), kNilIndex);
  EXPECT_EQ(l.back(), kNilIndex);
  l.PushBack(pool, 0);
  EXPECT_EQ(l.front(), 0u);
  EXPECT_EQ(l.back(), 0u);
  EXPECT_EQ(l.size(), 1);
  l.MoveToFront(pool, 0);
  EXPECT_EQ(l.size(), 1);
  l.Unlink(pool, 0);
  EXPECT_TRUE(l.empty());
  EXPECT_EQ(l.front(), kNilIndex);
  EXPECT_EQ(l.back(), kNilIndex);
  EXPECT_EQ(pool[0].prev, kNilIndex);
  EXPECT_EQ(pool[0].next, kNilIndex);
}

// Least recently used order: touch moves to the front, the victim is the back.
TEST(IndexListTest, MoveToFrontKeepsRecencyOrder) {
  std::vector<Node> pool(4);
  IndexList<Node> l;
  for (uint32_t i = 0; i < 4; ++i) l.PushFront(pool, i);  // 3 is the most recent, 0 the least
  EXPECT_EQ(Forward(l, pool), (std::vector<uint32_t>{3, 2, 1, 0}));
  l.MoveToFront(pool, 0);
  l.MoveToFront(pool, 2);
  EXPECT_EQ(Forward(l, pool), (std::vector<uint32_t>{2, 0, 3, 1}));
  EXPECT_EQ(l.back(), 1u);
  EXPECT_EQ(Backward(l, pool), Forward(l, pool));
}

// Every operation against std::list on random sequences: same order both ways, same size.
TEST(IndexListTest, MatchesStdListUnderRandomOperations) {
  constexpr uint32_t kN = 16;
  std::mt19937 rng(7);
  std::vector<Node> pool(kN);
  IndexList<Node> l;
  std::list<uint32_t> ref;
  std::vector<bool> in(kN, false);
  for (int step = 0; step < 20000; ++step) {
    const uint32_t i = rng() % kN;
    const int op = static_cast<int>(rng() % 6);
    if (!in[i]) {
      if (op % 2 == 0 || ref.empty()) {
        l.PushFront(pool, i);
        ref.push_front(i);
      } else if (op == 1) {
        l.PushBack(pool, i);
        ref.push_back(i);
      } else {
        const uint32_t pos = *std::next(ref.begin(), static_cast<long>(rng() % ref.size()));
        auto it = std::find(ref.begin(), ref.end(), pos);
        if (op == 3) {
          l.InsertAfter(pool, pos, i);
          ref.insert(std::next(it), i);
        } else {
          l.InsertBefore(pool, pos, i);
          ref.insert(it, i);
        }
      }
      in[i] = true;
    } else if (op < 3) {
      l.Unlink(pool, i);
      ref.remove(i);
      in[i] = false;
    } else {
      l.MoveToFront(pool, i);
      ref.remove(i);
      ref.push_front(i);
    }
    const std::vector<uint32_t> want(ref.begin(), ref.end());
    ASSERT_EQ(Forward(l, pool), want) << "step " << step;
    ASSERT_EQ(Backward(l, pool), want) << "step " << step;
    ASSERT_EQ(l.size(), static_cast<int64_t>(ref.size()));
  }
}

TEST(NodePoolTest, HandsOutEveryNodeOnceThenChecks) {
  NodePool<Node> pool(3);
  std::vector<uint32_t> got;
  for (int k = 0; k < 3; ++k) got.push_back(pool.Allocate());
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<uint32_t>{0, 1, 2}));
  pool.Free(1);
  EXPECT_EQ(pool.Allocate(), 1u);
  EXPECT_DEATH(pool.Allocate(), "node pool exhausted");
}

}  // namespace
}  // namespace mer
