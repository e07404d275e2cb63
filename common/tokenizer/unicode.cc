#include "common/tokenizer/unicode.h"

#include <algorithm>
#include <array>

namespace mer::unicode {
namespace {

constexpr bool IsContinuation(uint8_t byte) { return (byte & 0xC0) == 0x80; }

constexpr bool IsSelfMappedByte(int byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
}

struct ByteMaps {
  std::array<uint32_t, 256> byte_to_cp{};
  // Every ByteToUnicode value is below 0x144 (0xFF self-mapped, or 0x100 + 67 at most).
  std::array<int16_t, 0x144> cp_to_byte{};
};

constexpr ByteMaps MakeByteMaps() {
  ByteMaps maps;
  for (auto& b : maps.cp_to_byte) b = -1;
  uint32_t next_shifted = 0x100;
  for (int byte = 0; byte < 256; ++byte) {
    const uint32_t cp = IsSelfMappedByte(byte) ? static_cast<uint32_t>(byte) : next_shifted++;
    maps.byte_to_cp[byte] = cp;
    maps.cp_to_byte[cp] = static_cast<int16_t>(byte);
  }
  return maps;
}

constexpr ByteMaps kByteMaps = MakeByteMaps();
static_assert(kByteMaps.byte_to_cp[' '] == 0x120);   // 'Ġ'
static_assert(kByteMaps.byte_to_cp['\n'] == 0x10A);  // 'Ċ'
static_assert(kByteMaps.byte_to_cp[0xAD] == 0x143);

// ASCII classes as llama.cpp's collapsed regex sees them: std::regex's \s is C isspace, letters are
// A-Za-z and numbers 0-9. This agrees with the generated table; it is only a fast path.
constexpr std::array<CodepointClass, 128> MakeAsciiClasses() {
  std::array<CodepointClass, 128> cls{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) {
      cls[c] = CodepointClass::kLetter;
    } else if (c >= '0' && c <= '9') {
      cls[c] = CodepointClass::kNumber;
    } else if (c == ' ' || (c >= '\t' && c <= '\r')) {
      cls[c] = CodepointClass::kSpace;
    } else {
      cls[c] = CodepointClass::kOther;
    }
  }
  return cls;
}

constexpr std::array<CodepointClass, 128> kAsciiClasses = MakeAsciiClasses();

}  // namespace

uint32_t DecodeOne(std::string_view text, size_t* offset) {
  const size_t i = *offset;
  const size_t left = text.size() - i;
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[i + k]); };
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) {
    *offset = i + 1;
    return b0;
  }
  uint32_t cp = 0;
  size_t len = 0;
  if ((b0 & 0xE0) == 0xC0) {
    if (left >= 2 && IsContinuation(byte(1))) {
      cp = (uint32_t{b0 & 0x1Fu} << 6) | (byte(1) & 0x3Fu);
      len = 2;
    }
  } else if ((b0 & 0xF0) == 0xE0) {
    if (left >= 3 && IsContinuation(byte(1)) && IsContinuation(byte(2))) {
      cp = (uint32_t{b0 & 0x0Fu} << 12) | (uint32_t{byte(1) & 0x3Fu} << 6) | (byte(2) & 0x3Fu);
      len = 3;
    }
  } else if ((b0 & 0xF8) == 0xF0) {
    if (left >= 4 && IsContinuation(byte(1)) && IsContinuation(byte(2)) && IsContinuation(byte(3))) {
      cp = (uint32_t{b0 & 0x07u} << 18) | (uint32_t{byte(1) & 0x3Fu} << 12) | (uint32_t{byte(2) & 0x3Fu} << 6) |
           (byte(3) & 0x3Fu);
      len = cp <= kMaxCodepoint ? 4 : 0;
    }
  }
  if (len == 0) {
    *offset = i + 1;
    return kReplacementChar;
  }
  *offset = i + len;
  return cp;
}

void Decode(std::string_view text, std::vector<uint32_t>* out) {
  out->reserve(out->size() + text.size());
  size_t offset = 0;
  while (offset < text.size()) out->push_back(DecodeOne(text, &offset));
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Canonicalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t offset = 0;
  while (offset < text.size()) AppendUtf8(DecodeOne(text, &offset), &out);
  return out;
}

CodepointClass Classify(uint32_t cp) {
  if (cp < 128) return kAsciiClasses[cp];
  const tokenizer_internal::CodepointRange* begin = tokenizer_internal::kCodepointRanges;
  const tokenizer_internal::CodepointRange* end = begin + tokenizer_internal::kCodepointRangeCount;
  // The last range whose first <= cp; cp is in it or in no range.
  const auto* it = std::upper_bound(
      begin, end, cp, [](uint32_t value, const tokenizer_internal::CodepointRange& r) { return value < r.first; });
  if (it == begin) return CodepointClass::kOther;
  --it;
  return cp <= it->last ? it->cls : CodepointClass::kOther;
}

uint32_t ByteToUnicode(uint8_t byte) { return kByteMaps.byte_to_cp[byte]; }

int UnicodeToByte(uint32_t cp) { return cp < kByteMaps.cp_to_byte.size() ? kByteMaps.cp_to_byte[cp] : -1; }

std::string ByteToken(uint8_t byte) {
  std::string text;
  AppendUtf8(ByteToUnicode(byte), &text);
  return text;
}

}  // namespace mer::unicode
