// Tensor element types, numbered as in GGUF/ggml (the file format fixes the numbers).
// mer reads and computes on the weight types of the table in ggml_type.cc; Q8_1 and Q8_K exist
// only as activation formats of dot products (as in ggml's CPU backend).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace mer {

// The numbers of the types mer knows. Only those in ggml_type.cc's table are read and computed
// on (FindGgmlType is nullopt for the others, Traits CHECK-fails).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  absl::string_view name;  // "q8_0", as ggml spells it
  int64_t block_elements;  // elements per block (1 for float types)
  int64_t block_bytes;     // bytes per block
  bool weight;             // tensors may have it (false: an activation format only)
};

// Traits of a supported type; nullopt for a number mer does not know (for example from a file).
std::optional<GgmlTypeTraits> FindGgmlType(uint32_t type_number);
const GgmlTypeTraits& Traits(GgmlType type);  // CHECKs that `type` is a supported enumerator.
inline absl::string_view TypeName(GgmlType type) { return Traits(type).name; }
// Parses "q8_0", "f16", ... (the names of Traits); nullopt when unknown.
std::optional<GgmlType> ParseGgmlTypeName(absl::string_view name);

// Bytes of one row of `n` elements; n must be a multiple of the block size (CHECKed).
int64_t RowBytes(GgmlType type, int64_t n);
inline bool IsRowSizeValid(GgmlType type, int64_t n) { return n % Traits(type).block_elements == 0; }

// A weight type stored as blocks of quantized values with their scales: every weight type but F32,
// F16 and BF16. False for the activation-only formats (Q8_1, Q8_K) and for numbers mer does not
// know.
bool IsQuantizedWeightType(GgmlType type);

// The names of the weight types, comma-separated in numbering order ("f32, f16, q8_0, ..."):
// for messages that list what mer reads.
const std::string& WeightTypeNames();

}  // namespace mer
