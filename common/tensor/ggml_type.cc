#include "common/tensor/ggml_type.h"

#include "common/base/check.h"

namespace mer {
namespace {

struct Entry {
  GgmlType type;
  GgmlTypeTraits traits;
};

// Block layouts: common/quant/blocks.h.
constexpr Entry kTypes[] = {
    {GgmlType::kF32, {"f32", 1, 4, true}},
    {GgmlType::kF16, {"f16", 1, 2, true}},
    {GgmlType::kQ4_0, {"q4_0", 32, 18, true}},
    {GgmlType::kQ4_1, {"q4_1", 32, 20, true}},
    {GgmlType::kQ5_0, {"q5_0", 32, 22, true}},
    {GgmlType::kQ5_1, {"q5_1", 32, 24, true}},
    {GgmlType::kQ8_0, {"q8_0", 32, 34, true}},
    {GgmlType::kQ8_1, {"q8_1", 32, 36, false}},
    {GgmlType::kQ2_K, {"q2_k", 256, 84, true}},
    {GgmlType::kQ3_K, {"q3_k", 256, 110, true}},
    {GgmlType::kQ4_K, {"q4_k", 256, 144, true}},
    {GgmlType::kQ5_K, {"q5_k", 256, 176, true}},
    {GgmlType::kQ6_K, {"q6_k", 256, 210, true}},
    {GgmlType::kQ8_K, {"q8_k", 256, 292, false}},
    {GgmlType::kIQ2_XXS, {"iq2_xxs", 256, 66, true}},
    {GgmlType::kIQ2_XS, {"iq2_xs", 256, 74, true}},
    {GgmlType::kIQ3_XXS, {"iq3_xxs", 256, 98, true}},
    {GgmlType::kIQ1_S, {"iq1_s", 256, 50, true}},
    {GgmlType::kIQ4_NL, {"iq4_nl", 32, 18, true}},
    {GgmlType::kIQ3_S, {"iq3_s", 256, 110, true}},
    {GgmlType::kIQ2_S, {"iq2_s", 256, 82, true}},
    {GgmlType::kIQ4_XS, {"iq4_xs", 256, 136, true}},
    {GgmlType::kBF16, {"bf16", 1, 2, true}},
};

}  // namespace

std::optional<GgmlTypeTraits> FindGgmlType(uint32_t type_number) {
  for (const Entry& e : kTypes) {
    if (static_cast<uint32_t>(e.type) == type_number) return e.traits;
  }
  return std::nullopt;
}

const GgmlTypeTraits& Traits(GgmlType type) {
  for (const Entry& e : kTypes) {
    if (e.type == type) return e.traits;
  }
  CHECK_MSG(false, "unsupported GgmlType enumerator");
}

std::optional<GgmlType> ParseGgmlTypeName(absl::string_view name) {
  for (const Entry& e : kTypes) {
    if (e.traits.name == name) return e.type;
  }
  return std::nullopt;
}

const std::string& WeightTypeNames() {
  static const std::string names = [] {
    std::string s;
    for (const Entry& e : kTypes) {
      if (!e.traits.weight) continue;
      if (!s.empty()) s += ", ";
      s += std::string(e.traits.name);
    }
    return s;
  }();
  return names;
}

bool IsQuantizedWeightType(GgmlType type) {
  const std::optional<GgmlTypeTraits> t = FindGgmlType(static_cast<uint32_t>(type));
  return t.has_value() && t->weight && t->block_elements > 1;
}

int64_t RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = Traits(type);
  CHECK(n % t.block_elements == 0);
  return n / t.block_elements * t.block_bytes;
}

}  // namespace mer
