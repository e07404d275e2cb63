#include "services/gateway/text_stream.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace mer::gateway {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The length of the valid UTF-8 character at s[0], 0 when s is a valid but incomplete prefix of
// one, -1 when s[0] cannot start a valid character (or its continuation is wrong).
int CharLength(absl::string_view s) {
  const unsigned char b0 = s[0];
  if (b0 < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if (i >= static_cast<int>(s.size())) return 0;
    const unsigned char b = s[i];
    if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -1;
  }
  return len;
}

}  // namespace

size_t Utf8ErrorOffset(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII runs, the common case, a word at a time.
    while (i + 8 <= s.size()) {
      uint64_t word;
      std::memcpy(&word, s.data() + i, 8);
      if ((word & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i == s.size()) break;
    const int n = CharLength(s.substr(i));
    if (n <= 0) return i;
    i += n;
  }
  return s.size();
}

bool IsValidUtf8(absl::string_view s) { return Utf8ErrorOffset(s) == s.size(); }

TextStream::TextStream(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

void TextStream::Decode(bool final) {
  size_t i = 0;
  while (i < raw_.size()) {
    const int n = CharLength(absl::string_view(raw_).substr(i));
    if (n == 0) {
      if (!final) break;
      decoded_.append(kReplacement);  // an incomplete character at the end
      i = raw_.size();
    } else if (n < 0) {
      decoded_.append(kReplacement);  // one byte that cannot start or continue a character
      ++i;
    } else {
      decoded_.append(raw_, i, n);
      i += n;
    }
  }
  raw_.erase(0, i);
}

std::string TextStream::Release(bool final) {
  // The earliest stop occurrence wins; text before it is final.
  size_t cut = std::string::npos;
  const std::string* stop = nullptr;
  for (const std::string& s : stops_) {
    if (const size_t at = decoded_.find(s); at < cut) {
      cut = at;
      stop = &s;
    }
  }
  if (stop != nullptr) {
    std::string out = decoded_.substr(0, cut);
    decoded_.clear();
    raw_.clear();
    stopped_ = true;
    stop_sequence_ = *stop;
    return out;
  }
  size_t keep = 0;
  if (!final) {
    // Hold the longest suffix that is a proper prefix of some stop sequence. It starts at a
    // character boundary, since the stop sequence starts with one.
    for (const std::string& s : stops_) {
      for (size_t k = std::min(s.size() - 1, decoded_.size()); k > keep; --k) {
        if (decoded_.compare(decoded_.size() - k, k, s, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
  }
  std::string out = decoded_.substr(0, decoded_.size() - keep);
  decoded_.erase(0, decoded_.size() - keep);
  return out;
}

std::string TextStream::Append(absl::string_view bytes) {
  if (stopped_) return "";
  raw_.append(bytes.data(), bytes.size());
  Decode(false);
  return Release(false);
}

std::string TextStream::Finish() {
  if (stopped_) return "";
  Decode(true);
  return Release(true);
}

}  // namespace mer::gateway
