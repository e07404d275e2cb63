// The type table's predicates, pinned to the types' definitions rather than to the table.
#include "common/tensor/ggml_type.h"

#include <set>

#include "gtest/gtest.h"

namespace mer {
namespace {

// The weight types stored as quantized blocks: all but the float types, and no activation-only
// format (Q8_1, Q8_K); numbers mer does not know (4 and 5 were ggml's removed Q4_2 and Q4_3) are
// none of them.
TEST(GgmlType, QuantizedWeightTypes) {
  const std::set<GgmlType> quantized = {
      GgmlType::kQ4_0,    GgmlType::kQ4_1,   GgmlType::kQ5_0,  GgmlType::kQ5_1,    GgmlType::kQ8_0,   GgmlType::kQ2_K,
      GgmlType::kQ3_K,    GgmlType::kQ4_K,   GgmlType::kQ5_K,  GgmlType::kQ6_K,    GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
      GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ2_S, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,  GgmlType::kIQ1_S};
  for (uint32_t n = 0; n < 64; ++n) {
    const auto type = static_cast<GgmlType>(n);
    EXPECT_EQ(IsQuantizedWeightType(type), quantized.count(type) == 1) << n;
  }
}

}  // namespace
}  // namespace mer
