// DeviceBufferTable: every declared buffer lies inside the allocation, aligned, disjoint from the
// others, in declaration order, and Bind hands each pointer its own buffer, at any sizes
// (sizes that are not multiples of the alignment are what the engine's geometries produce).
#include "services/compute/cuda/device_buffers.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace mer::cuda {
namespace {

TEST(DeviceBufferTable, BuffersAreAlignedDisjointAndInsideTheAllocation) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    DeviceBufferTable table;
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<float*> floats(n, nullptr);
    std::vector<int64_t> sizes(n);
    for (int i = 0; i < n; ++i) {
      // Mostly odd sizes (head_dim * 4 = 320, n_embd * 4 = 640, ...), some zero.
      sizes[i] = rng() % 5 == 0 ? 0 : static_cast<int64_t>(rng() % 100000);
      table.Add(&floats[i], sizes[i], "buffer");
    }
    ASSERT_EQ(table.count(), n);
    alignas(256) static uint8_t fake_base_storage[256];
    uint8_t* base = fake_base_storage;  // Bind only computes addresses: nothing is written
    table.Bind(base);
    int64_t prev_end = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t offset = reinterpret_cast<uint8_t*>(floats[i]) - base;
      EXPECT_EQ(offset % DeviceBufferTable::kAlign, 0) << i;
      EXPECT_GE(offset, prev_end) << i;  // after (and so disjoint from) every earlier buffer
      EXPECT_LE(offset + sizes[i], table.bytes()) << i;
      prev_end = offset + sizes[i];
    }
    const auto extents = table.Extents();
    ASSERT_EQ(static_cast<int>(extents.size()), n);
    for (int i = 0; i < n; ++i) EXPECT_EQ(extents[i].bytes, sizes[i]);
  }
}

TEST(DeviceBufferTable, TheSizeCountsEveryBufferRoundedUp) {
  DeviceBufferTable table;
  float* a = nullptr;
  int32_t* b = nullptr;
  uint8_t* c = nullptr;
  EXPECT_EQ(table.Add(&a, 640, "a"), 0);    // 2.5 alignment units
  EXPECT_EQ(table.Add(&b, 320, "b"), 768);  // starts after a rounded up
  EXPECT_EQ(table.Add(&c, 256, "c"), 1280);
  EXPECT_EQ(table.bytes(), 1536);
  // The sum of AlignUp(640) + AlignUp(320), not AlignUp(960): the mistake of sizing two buffers
  // as one.
  EXPECT_GT(table.bytes(), DeviceBufferTable::AlignUp(640 + 320 + 256));
}

TEST(DeviceBufferTable, AnEntryBindsThroughItsCallback) {
  DeviceBufferTable table;
  uint8_t* first = nullptr;
  uint8_t* second = nullptr;
  table.Add(&first, 10, "first");
  table.AddEntry(10, "second", [&](uint8_t* p) { second = p; });
  alignas(256) static uint8_t storage[1];
  table.Bind(storage);
  EXPECT_EQ(first, storage);
  EXPECT_EQ(second, storage + 256);
}

}  // namespace
}  // namespace mer::cuda
