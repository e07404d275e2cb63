// The qwen2 pre-tokenizer: splits text into the pieces that BPE then merges within.
//
// Qwen2's tokenizer.json regex (the one llama.cpp uses for tokenizer.ggml.pre = "qwen2"):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// implemented by hand with the semantics of llama.cpp's run of it: std::regex (leftmost match, first
// alternative that matches, backtracking within it) over the code points' classes, with the contractions
// case-insensitive for ASCII only ('[sS]|'[tT]|...), \s = White_Space, \p{L} = L*, \p{N} = N* (see
// unicode_tables.h). Every code point starts some alternative, so the pieces cover the text without
// gaps, and no piece is empty. Cross-checked against llama.cpp on every code point and on random text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "common/tokenizer/unicode.h"

namespace mer {

// Splits `cpts` (with classes[i] == unicode::Classify(cpts[i])) into pieces and appends each piece's
// length in code points to `piece_lengths`. The lengths are >= 1 and sum to cpts.size(). The text is
// one fragment: `(?!\S)` sees the end of `cpts` as the end of the text.
void SplitQwen2(absl::Span<const uint32_t> cpts, absl::Span<const unicode::CodepointClass> classes,
                std::vector<uint32_t>* piece_lengths);

// Convenience for tests and tools: the pieces of `text` as (canonical) UTF-8 strings.
std::vector<std::string> PreTokenizeQwen2(std::string_view text);

}  // namespace mer
