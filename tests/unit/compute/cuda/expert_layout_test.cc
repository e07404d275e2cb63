// The experts' slot layout: gate, up and down each of its own type and size, in slot order,
// aligned and disjoint; for gate and up of different types (sizes that the same-type layout of
// gate's type would get wrong) and for every expert type the cuda backend takes.
#include "services/compute/cuda/expert_layout.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/compute/cuda/device_buffers.h"

namespace mer::cuda {
namespace {

constexpr GgmlType kExpertTypes[] = {
    GgmlType::kF32,     GgmlType::kF16,   GgmlType::kBF16,   GgmlType::kQ8_0,    GgmlType::kQ4_0,   GgmlType::kQ4_1,
    GgmlType::kQ5_0,    GgmlType::kQ5_1,  GgmlType::kIQ4_NL, GgmlType::kQ2_K,    GgmlType::kQ3_K,   GgmlType::kQ4_K,
    GgmlType::kQ5_K,    GgmlType::kQ6_K,  GgmlType::kIQ4_XS, GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ2_S,
    GgmlType::kIQ3_XXS, GgmlType::kIQ3_S, GgmlType::kIQ1_S};

void ExpectValid(const ExpertLayout& l, GgmlType gate, GgmlType up, GgmlType down, int64_t embd, int64_t ff) {
  const ExpertMatrixPlace want[3] = {{gate, ff, embd, 0, ff * RowBytes(gate, embd)},
                                     {up, ff, embd, 0, ff * RowBytes(up, embd)},
                                     {down, embd, ff, 0, embd * RowBytes(down, ff)}};
  const auto places = l.matrices();
  int64_t end = 0;
  for (int i = 0; i < 3; ++i) {
    const ExpertMatrixPlace& m = *places[i];
    EXPECT_EQ(m.type, want[i].type) << i;
    EXPECT_EQ(m.rows, want[i].rows) << i;
    EXPECT_EQ(m.cols, want[i].cols) << i;
    EXPECT_EQ(m.bytes, want[i].bytes) << i;
    EXPECT_EQ(m.offset % DeviceBufferTable::kAlign, 0) << i;
    EXPECT_GE(m.offset, end) << i;  // after the matrix before it
    EXPECT_LT(m.offset - end, DeviceBufferTable::kAlign) << i;
    end = m.offset + m.bytes;
  }
  EXPECT_EQ(places[0], &l.gate);
  EXPECT_EQ(places[1], &l.up);
  EXPECT_EQ(places[2], &l.down);
  EXPECT_EQ(l.end(), end);
  EXPECT_EQ(l.bytes(), want[0].bytes + want[1].bytes + want[2].bytes);
}

TEST(ExpertLayout, GateUpAndDownOfDifferentTypes) {
  // Q4_K gate (144 B a block), Q5_K up (176 B), Q6_K down (210 B), at the 30B geometry.
  const ExpertLayout l = ExpertLayoutFor(GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, 2048, 768);
  ExpectValid(l, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, 2048, 768);
  EXPECT_EQ(l.gate.bytes, 768 * 8 * 144);
  EXPECT_EQ(l.up.offset, 768 * 8 * 144);  // a multiple of 256 already
  EXPECT_EQ(l.up.bytes, 768 * 8 * 176);
  EXPECT_EQ(l.down.offset, 768 * 8 * (144 + 176));
  EXPECT_EQ(l.down.bytes, 2048 * 3 * 210);
  EXPECT_EQ(l.end(), 768 * 8 * (144 + 176) + 2048 * 3 * 210);

  // An up larger than gate: the down matrix moves past it.
  const ExpertLayout small_gate = ExpertLayoutFor(GgmlType::kIQ2_XXS, GgmlType::kQ8_0, GgmlType::kQ4_K, 256, 256);
  EXPECT_EQ(small_gate.up.offset, 256 * 66);
  EXPECT_EQ(small_gate.down.offset, 256 * 66 + 256 * 8 * 34);
  ExpectValid(small_gate, GgmlType::kIQ2_XXS, GgmlType::kQ8_0, GgmlType::kQ4_K, 256, 256);
}

TEST(ExpertLayout, EveryPairOfExpertTypes) {
  for (GgmlType gate : kExpertTypes)
    for (GgmlType up : kExpertTypes)
      for (GgmlType down : {GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kIQ1_S}) {
        SCOPED_TRACE(absl::StrCat(TypeName(gate), "/", TypeName(up), "/", TypeName(down)));
        ExpectValid(ExpertLayoutFor(gate, up, down, 512, 768), gate, up, down, 512, 768);
      }
}

// Every expert type but the float ones has a device layout of its own, uploaded through the
// repack kernel (repack.cuh, kquant_repack.cuh).
TEST(ExpertLayout, NeedsRepackAllButTheFloatTypes) {
  for (GgmlType t : kExpertTypes)
    EXPECT_EQ(NeedsRepack(t), t != GgmlType::kF32 && t != GgmlType::kF16 && t != GgmlType::kBF16) << TypeName(t);
  EXPECT_FALSE(NeedsRepack(GgmlType::kQ8_K));  // activation types, never a weight's
  EXPECT_FALSE(NeedsRepack(GgmlType::kQ8_1));
  EXPECT_FALSE(NeedsRepack(static_cast<GgmlType>(4)));  // a number mer does not know
}

}  // namespace
}  // namespace mer::cuda
