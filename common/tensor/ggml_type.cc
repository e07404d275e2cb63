#include "common/tensor/ggml_type.h"

#include "common/base/check.h"

namespace mer {
namespace {

struct Entry {
  GgmlType type;
  GgmlTypeTraits traits;
};

// Block layouts: Q8_0 = f16 d + 32 x i8; Q4_K = f16 d, f16 dmin, 12 B scales, 128 B nibbles;
// Q6_K = 128 B low nibbles, 64 B high bits, 16 x i8 scales, f16 d; Q8_K = f32 d, 256 x i8, 16 x i16 sums.
constexpr Entry kTypes[] = {
    {GgmlType::kF32, {"f32", 1, 4}},         {GgmlType::kF16, {"f16", 1, 2}},
    {GgmlType::kQ8_0, {"q8_0", 32, 34}},     {GgmlType::kQ4_K, {"q4_k", 256, 144}},
    {GgmlType::kQ6_K, {"q6_k", 256, 210}},   {GgmlType::kQ8_K, {"q8_k", 256, 292}},
    {GgmlType::kBF16, {"bf16", 1, 2}},
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

int64_t RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = Traits(type);
  CHECK(n % t.block_elements == 0);
  return n / t.block_elements * t.block_bytes;
}

}  // namespace mer
