// libFuzzer target for the gateway's streamed text (services/gateway/text_stream.h), which turns
// model output -- arbitrary bytes -- into stream messages. The input is split at NUL bytes: the
// first (data[0] % 4) parts after the first byte are stop sequences (invalid or empty ones are
// dropped, as the gateway's validation would reject them), the rest are token pieces. Checks:
// every released piece is valid UTF-8; without stops, the streamed text equals the text of the
// whole output decoded at once; with stops, it is a prefix of that text and contains no stop
// sequence.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/base/check.h"
#include "services/gateway/text_stream.h"

using mer::gateway::IsValidUtf8;
using mer::gateway::TextStream;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int n_stops = data[0] % 4;
  std::vector<std::string> parts(1);
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      parts.emplace_back();
    } else {
      parts.back().push_back(static_cast<char>(data[i]));
    }
  }
  std::vector<std::string> stops;
  size_t first_piece = 0;
  for (; first_piece < parts.size() && static_cast<int>(first_piece) < n_stops; ++first_piece) {
    if (!parts[first_piece].empty() && IsValidUtf8(parts[first_piece])) stops.push_back(parts[first_piece]);
  }
  std::string all;
  for (size_t i = first_piece; i < parts.size(); ++i) all += parts[i];

  TextStream bulk;
  const std::string whole = bulk.Append(all) + bulk.Finish();
  CHECK(IsValidUtf8(whole));

  TextStream stream(stops);
  std::string streamed;
  for (size_t i = first_piece; i < parts.size(); ++i) {
    const std::string piece = stream.Append(parts[i]);
    CHECK(IsValidUtf8(piece));
    streamed += piece;
  }
  const std::string tail = stream.Finish();
  CHECK(IsValidUtf8(tail));
  streamed += tail;
  if (stops.empty()) {
    CHECK(streamed == whole);
    CHECK(!stream.stopped());
  } else {
    CHECK(whole.compare(0, streamed.size(), streamed) == 0);
    for (const std::string& s : stops) CHECK(streamed.find(s) == std::string::npos);
    if (!stream.stopped()) CHECK(streamed == whole);
  }
  return 0;
}
