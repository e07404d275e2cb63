// The code point class table, generated into unicode_tables.cc by gen_unicode_tables.py.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mer::tokenizer_internal {

// What the qwen2 pre-tokenizer regex distinguishes: \s, \p{L}, \p{N}, and everything else.
enum class CodepointClass : uint8_t {
  kOther = 0,
  kLetter = 1,  // general category L*
  kNumber = 2,  // general category N*
  kSpace = 3,   // White_Space property
};

struct CodepointRange {
  uint32_t first;  // inclusive
  uint32_t last;   // inclusive
  CodepointClass cls;
};

// Invariant: sorted by `first`, disjoint, no range of kOther. A code point in no range is kOther.
extern const CodepointRange kCodepointRanges[];
extern const size_t kCodepointRangeCount;
extern const char kUnicodeVersion[];  // the Unicode version the classes follow: "15.1.0", as llama.cpp

}  // namespace mer::tokenizer_internal
