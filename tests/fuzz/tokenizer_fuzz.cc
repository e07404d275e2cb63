// libFuzzer target for the tokenizer: arbitrary bytes must encode without crashing, every id must be in
// the vocabulary, and decoding must give back the input as the tokenizer sees it (its canonical UTF-8
// form: each invalid byte as U+FFFD).
//
// The first input byte picks the options; the rest is the text. The vocabulary is the synthetic one,
// whose special tokens are ASCII, so splitting them out before UTF-8 decoding cannot change what the
// text around them decodes to, and the canonical form of the whole input is the expected output.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/check.h"
#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"

namespace {

const mer::Tokenizer& FuzzTokenizer() {
  static const mer::Tokenizer* tokenizer = [] {
    absl::StatusOr<mer::Tokenizer> created = mer::Tokenizer::Create(mer::MakeSyntheticVocab(1024, 700));
    CHECK_MSG(created.ok(), "the synthetic vocabulary must be valid");
    return new mer::Tokenizer(*std::move(created));
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const mer::Tokenizer& tokenizer = FuzzTokenizer();
  const bool parse_special = (data[0] & 1) != 0;
  const bool add_special = (data[0] & 2) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);

  const std::vector<int32_t> ids = tokenizer.Encode(text, parse_special, add_special);
  for (int32_t id : ids) CHECK(id >= 0 && id < tokenizer.vocab_size());
  CHECK(tokenizer.Decode(ids, /*render_special=*/true) == mer::unicode::Canonicalize(text));

  // Streaming decode: the per-token pieces concatenate to the whole decode.
  std::string streamed;
  for (int32_t id : ids) streamed += tokenizer.TokenPiece(id);
  CHECK(streamed == tokenizer.Decode(ids));
  return 0;
}
