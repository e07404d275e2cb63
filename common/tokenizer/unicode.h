// Unicode helpers for the byte-level BPE tokenizer: lenient UTF-8 decoding (llama.cpp's rules), UTF-8
// encoding, code point classes for the pre-tokenizer, and GPT-2's byte <-> unicode mapping.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/unicode_tables.h"

namespace mer::unicode {

using tokenizer_internal::CodepointClass;

inline constexpr uint32_t kReplacementChar = 0xFFFD;
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// Decodes one code point at `*offset` (< text.size()) and advances `*offset` past it, never reading
// beyond text.size(). Follows llama.cpp's unicode_cpt_from_utf8 + unicode_cpts_from_utf8 so that
// mer pre-tokenizes exactly the code points llama.cpp does:
//  - a lead byte of 2, 3 or 4 bytes needs that many bytes with 10xxxxxx continuations;
//  - overlong forms and surrogates (U+D800..U+DFFF) are accepted as they decode;
//  - anything else (a stray continuation byte, 0xF8..0xFF, a truncated or broken sequence) yields
//    U+FFFD and consumes exactly one byte, so each invalid byte becomes its own U+FFFD;
//  - a 4-byte form above U+10FFFF (where llama.cpp would throw later) is treated as invalid too.
// Postcondition: the result is <= kMaxCodepoint and *offset advanced by 1..4.
uint32_t DecodeOne(std::string_view text, size_t* offset);

// Appends the code points of `text` (see DecodeOne) to `out`.
void Decode(std::string_view text, std::vector<uint32_t>* out);

// Appends the shortest UTF-8 form of `cp` (<= kMaxCodepoint; surrogates are encoded as 3 bytes, as
// llama.cpp does).
void AppendUtf8(uint32_t cp, std::string* out);

// Decode then re-encode: what the tokenizer actually sees for `text`. Identity on valid UTF-8.
std::string Canonicalize(std::string_view text);

// The class of `cp` for the qwen2 pre-tokenizer regex (\s, \p{L}, \p{N} or other).
CodepointClass Classify(uint32_t cp);

// GPT-2's bytes_to_unicode: printable bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) map to themselves,
// the other 68 bytes, in increasing order, to U+0100, U+0101, ...
uint32_t ByteToUnicode(uint8_t byte);

// The inverse of ByteToUnicode, or -1 for a code point no byte maps to.
int UnicodeToByte(uint32_t cp);

// UTF-8 text of ByteToUnicode(byte): the vocabulary string of the byte's token.
std::string ByteToken(uint8_t byte);

}  // namespace mer::unicode
