// Tensor element types, numbered as in GGUF/ggml (the file format fixes the numbers).
// mer reads and computes on F32, F16, BF16, Q8_0, Q4_K and Q6_K; Q8_K exists only as the
// activation format that K-quant dot products use (as in ggml's CPU backend).
#pragma once

#include <cstdint>
#include <optional>
#include "absl/strings/string_view.h"

namespace mer {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

struct GgmlTypeTraits {
  absl::string_view name;      // "q8_0", as ggml spells it
  int64_t block_elements;     // elements per block (1 for float types)
  int64_t block_bytes;        // bytes per block
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

}  // namespace mer
