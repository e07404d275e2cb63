// Streamed text for Generate: turns each generated token's bytes into text that is safe to send
// now. Two reasons to hold bytes back:
//  - UTF-8: a token may end in the middle of a character (byte-level BPE splits characters
//    freely); its bytes wait for the rest. Bytes that can never form a character become U+FFFD,
//    as does an incomplete character left at Finish, so every piece is valid UTF-8 (proto3
//    strings must be).
//  - Stop sequences: text that could be the start of a stop sequence waits until it is decided;
//    a stop sequence may span several tokens. Once one occurs, the text before it is released,
//    it and everything after are dropped, and stopped() is true.
// Stop sequences are matched against the decoded text (after U+FFFD replacement).
//
// Thread-safety: none (one per call).
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace mer::gateway {

class TextStream {
 public:
  // `stops`: non-empty, valid UTF-8 strings.
  explicit TextStream(std::vector<std::string> stops = {});

  // Adds a token's bytes; returns the text that became safe to send (maybe empty). After
  // stopped(), returns "" and ignores its input.
  std::string Append(absl::string_view bytes);
  // The end of generation: the rest of the held text (an incomplete character becomes U+FFFD).
  std::string Finish();

  bool stopped() const { return stopped_; }
  // The stop sequence that stopped the stream (the earliest in the text), once stopped().
  const std::string& stop_sequence() const { return stop_sequence_; }

 private:
  // Moves complete characters (and U+FFFD for invalid bytes) from raw_ to decoded_; with
  // `final`, an incomplete tail too.
  void Decode(bool final);
  // Releases what of decoded_ can no longer start a stop sequence, or up to a stop.
  std::string Release(bool final);

  std::vector<std::string> stops_;
  std::string raw_;      // bytes not yet decoded (an incomplete character)
  std::string decoded_;  // valid UTF-8 not yet released
  bool stopped_ = false;
  std::string stop_sequence_;
};

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool IsValidUtf8(absl::string_view s);
// The offset of the first byte of `s` that is not part of a well-formed character (a truncated
// character at the end counts), or s.size() when `s` is valid UTF-8.
size_t Utf8ErrorOffset(absl::string_view s);

}  // namespace mer::gateway
