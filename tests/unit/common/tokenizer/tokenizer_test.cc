#include "common/tokenizer/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The 256 byte tokens, id = byte value, all NORMAL: the smallest valid vocabulary.
TokenizerVocab ByteVocab() {
  TokenizerVocab vocab;
  for (int b = 0; b < 256; ++b) {
    vocab.tokens.push_back(unicode::ByteToken(static_cast<uint8_t>(b)));
    vocab.token_types.push_back(static_cast<int32_t>(TokenType::kNormal));
  }
  return vocab;
}

int32_t AddToken(TokenizerVocab& vocab, std::string text, TokenType type = TokenType::kNormal) {
  vocab.tokens.push_back(std::move(text));
  vocab.token_types.push_back(static_cast<int32_t>(type));
  return static_cast<int32_t>(vocab.tokens.size()) - 1;
}

Tokenizer MustCreate(TokenizerVocab vocab) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(std::move(vocab));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

const Tokenizer& Synthetic() {
  static const Tokenizer* tokenizer = new Tokenizer(MustCreate(MakeSyntheticVocab(2048, 1800)));
  return *tokenizer;
}

// ---------------------------------------------------------------------------------------------
// BPE merge order on hand-made vocabularies.

TEST(BpeTest, WithoutMergesEveryByteIsItsOwnToken) {
  const Tokenizer tokenizer = MustCreate(ByteVocab());
  EXPECT_THAT(tokenizer.Encode("ab c"), ElementsAre('a', 'b', ' ', 'c'));
  EXPECT_THAT(tokenizer.Encode("\xC3\xA9"), ElementsAre(0xC3, 0xA9));
  EXPECT_THAT(tokenizer.Encode(""), IsEmpty());
}

TEST(BpeTest, LowestRankMergesFirst) {
  {
    TokenizerVocab vocab = ByteVocab();
    const int32_t ab = AddToken(vocab, "ab");
    AddToken(vocab, "bc");
    vocab.merges = {"a b", "b c"};
    EXPECT_THAT(MustCreate(vocab).Encode("abc"), ElementsAre(ab, 'c'));
  }
  {
    TokenizerVocab vocab = ByteVocab();
    AddToken(vocab, "ab");
    const int32_t bc = AddToken(vocab, "bc");
    vocab.merges = {"b c", "a b"};
    EXPECT_THAT(MustCreate(vocab).Encode("abc"), ElementsAre('a', bc));
  }
  {
    // "b c" first, then "a bc" builds "abc"; "a b" (rank 1) never applies because b is gone.
    TokenizerVocab vocab = ByteVocab();
    AddToken(vocab, "ab");
    AddToken(vocab, "bc");
    const int32_t abc = AddToken(vocab, "abc");
    vocab.merges = {"b c", "a b", "a bc"};
    EXPECT_THAT(MustCreate(vocab).Encode("abc"), ElementsAre(abc));
    EXPECT_THAT(MustCreate(vocab).Encode("abcabc"), ElementsAre(abc, abc));
  }
}

TEST(BpeTest, EqualRanksMergeLeftmostFirst) {
  TokenizerVocab vocab = ByteVocab();
  const int32_t aa = AddToken(vocab, "aa");
  const int32_t aaa = AddToken(vocab, "aaa");
  vocab.merges = {"a a", "aa a"};
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_THAT(tokenizer.Encode("aa"), ElementsAre(aa));
  EXPECT_THAT(tokenizer.Encode("aaa"), ElementsAre(aaa));
  EXPECT_THAT(tokenizer.Encode("aaaa"), ElementsAre(aa, aa));
  // a a a a a -> aa aa a (rank 0, left to right) -> aa aaa (rank 1; "aa aa" is no merge).
  EXPECT_THAT(tokenizer.Encode("aaaaa"), ElementsAre(aa, aaa));
}

TEST(BpeTest, MergesUseByteLevelNames) {
  TokenizerVocab vocab = ByteVocab();
  const int32_t space_t = AddToken(vocab, "\xC4\xA0t");      // "Ġt"
  const int32_t space_the = AddToken(vocab, "\xC4\xA0the");  // "Ġthe"
  const int32_t he = AddToken(vocab, "he");
  const int32_t newline2 = AddToken(vocab, "\xC4\x8A\xC4\x8A");  // "ĊĊ"
  vocab.merges = {"h e", "\xC4\xA0 t", "\xC4\xA0t he", "\xC4\x8A \xC4\x8A"};
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_THAT(tokenizer.Encode("the the\n\n"), ElementsAre('t', he, space_the, newline2));
  EXPECT_THAT(tokenizer.Encode(" to"), ElementsAre(space_t, 'o'));
  EXPECT_EQ(tokenizer.Decode({space_the}), " the");
  EXPECT_EQ(tokenizer.Decode({newline2}), "\n\n");
}

TEST(BpeTest, MergesNeverCrossPreTokenizerPieces) {
  TokenizerVocab vocab = ByteVocab();
  AddToken(vocab, "a\xC4\xA0");  // "aĠ": "a" then a space
  vocab.merges = {"a \xC4\xA0"};
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_THAT(tokenizer.Encode("a b"), ElementsAre('a', ' ', 'b'));  // pieces "a", " b"
  EXPECT_THAT(tokenizer.Encode("a  "), ElementsAre('a', ' ', ' '));  // pieces "a", "  "
}

TEST(BpeTest, BadMergesAreSkipped) {
  TokenizerVocab vocab = ByteVocab();
  const int32_t ab = AddToken(vocab, "ab");
  vocab.merges = {"x y",          // result "xy" is not a token
                  "nospace",      // no separator
                  "a q",          // result "aq" is not a token
                  "a b", "a b"};  // a duplicate: the first rank stays
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_EQ(tokenizer.num_merges(), 1);
  EXPECT_EQ(tokenizer.num_skipped_merges(), 3);
  EXPECT_THAT(tokenizer.Encode("xyab"), ElementsAre('x', 'y', ab));
}

TEST(BpeTest, LongPieceIsNotQuadratic) {
  // One piece of 1 MiB (a letter run); merges build up "a" * 2^k.
  TokenizerVocab vocab = ByteVocab();
  std::string run = "a";
  for (int k = 0; k < 10; ++k) {
    vocab.merges.push_back(run + " " + run);
    run += run;
    AddToken(vocab, run);
  }
  const Tokenizer tokenizer = MustCreate(vocab);
  const std::string text(1 << 20, 'a');
  const std::vector<int32_t> ids = tokenizer.Encode(text);
  EXPECT_EQ(ids.size(), size_t{1} << 10);
  EXPECT_EQ(tokenizer.Decode(ids), text);
}

// ---------------------------------------------------------------------------------------------
// Special tokens.

struct SpecialVocab {
  TokenizerVocab vocab = ByteVocab();
  int32_t im_start = AddToken(vocab, "<|im_start|>", TokenType::kControl);
  int32_t im_end = AddToken(vocab, "<|im_end|>", TokenType::kControl);
  int32_t think = AddToken(vocab, "<think>", TokenType::kUserDefined);
  int32_t pad = AddToken(vocab, "[PAD262]", TokenType::kUnused);
};

TEST(SpecialTokenTest, SplitsControlAndUserDefinedTokens) {
  SpecialVocab v;
  const Tokenizer tokenizer = MustCreate(v.vocab);
  EXPECT_THAT(tokenizer.Encode("<|im_start|>hi<|im_end|>"), ElementsAre(v.im_start, 'h', 'i', v.im_end));
  EXPECT_THAT(tokenizer.Encode("<think>x</think>"), ElementsAre(v.think, 'x', '<', '/', 't', 'h', 'i', 'n', 'k', '>'));
  EXPECT_THAT(tokenizer.Encode("<|im_end|><|im_end|>"), ElementsAre(v.im_end, v.im_end));
  EXPECT_THAT(tokenizer.Encode("<|im_end|"), ElementsAre('<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|'));
  // UNUSED tokens are never matched in text.
  EXPECT_THAT(tokenizer.Encode("[PAD262]"), ElementsAre('[', 'P', 'A', 'D', '2', '6', '2', ']'));
}

TEST(SpecialTokenTest, WithoutParseSpecialOnlyUserDefinedTokensSplit) {
  SpecialVocab v;
  const Tokenizer tokenizer = MustCreate(v.vocab);
  EXPECT_THAT(tokenizer.Encode("<|im_end|><think>", /*parse_special=*/false),
              ElementsAre('<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>', v.think));
}

TEST(SpecialTokenTest, TextBetweenSpecialTokensIsPreTokenizedSeparately) {
  SpecialVocab v;
  const int32_t space_x = AddToken(v.vocab, "\xC4\xA0x");            // "Ġx"
  const int32_t two_spaces = AddToken(v.vocab, "\xC4\xA0\xC4\xA0");  // "ĠĠ"
  v.vocab.merges = {"\xC4\xA0 x", "\xC4\xA0 \xC4\xA0"};
  const Tokenizer tokenizer = MustCreate(v.vocab);
  // Two spaces before a word: the run leaves its last space to the word.
  EXPECT_THAT(tokenizer.Encode("<|im_end|>  x"), ElementsAre(v.im_end, ' ', space_x));
  // A special token ends the fragment, and (?!\S) sees the end: the run stays whole.
  EXPECT_THAT(tokenizer.Encode("  <|im_end|>x"), ElementsAre(two_spaces, v.im_end, 'x'));
  // Without the special token the same bytes split differently.
  EXPECT_THAT(tokenizer.Encode("  <|im_end|>x", /*parse_special=*/false)[0], ' ');
}

TEST(SpecialTokenTest, LongestSpecialTokenIsSplitOutFirst) {
  // As llama.cpp's tokenizer_st_partition: longest text first over the whole input, not leftmost first.
  TokenizerVocab vocab = ByteVocab();
  const int32_t ab = AddToken(vocab, "ab", TokenType::kControl);
  const int32_t bcd = AddToken(vocab, "bcd", TokenType::kControl);
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_THAT(tokenizer.Encode("abcd"), ElementsAre('a', bcd));
  EXPECT_THAT(tokenizer.Encode("abcdab"), ElementsAre('a', bcd, ab));
  EXPECT_THAT(tokenizer.Encode("abab"), ElementsAre(ab, ab));
}

TEST(SpecialTokenTest, EndOfTurnTextsAreControlWhateverTheirStoredType) {
  TokenizerVocab vocab = ByteVocab();
  const int32_t im_end = AddToken(vocab, "<|im_end|>", TokenType::kNormal);
  const int32_t fim = AddToken(vocab, "<|fim_prefix|>", TokenType::kUserDefined);
  const int32_t other = AddToken(vocab, "<|other|>", TokenType::kNormal);
  vocab.eos_id = other;
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_EQ(tokenizer.GetTokenType(im_end), TokenType::kControl);
  EXPECT_EQ(tokenizer.GetTokenType(fim), TokenType::kControl);
  EXPECT_EQ(tokenizer.GetTokenType(other), TokenType::kNormal);
  EXPECT_TRUE(tokenizer.IsEndOfGeneration(im_end));
  EXPECT_TRUE(tokenizer.IsEndOfGeneration(other));  // eos
  EXPECT_FALSE(tokenizer.IsEndOfGeneration(fim));
  EXPECT_FALSE(tokenizer.IsEndOfGeneration('a'));
  EXPECT_THAT(tokenizer.EndOfGenerationIds(), ElementsAre(im_end, other));
  EXPECT_THAT(tokenizer.Encode("a<|im_end|>"), ElementsAre('a', im_end));
}

// ---------------------------------------------------------------------------------------------
// Decoding.

TEST(DecodeTest, PiecesByTokenType) {
  SpecialVocab v;
  const int32_t hello = AddToken(v.vocab, "\xC4\xA0hello");
  const int32_t byte_type = AddToken(v.vocab, "<0x41>", TokenType::kByte);
  const Tokenizer tokenizer = MustCreate(v.vocab);
  EXPECT_EQ(tokenizer.TokenPiece(hello), " hello");
  EXPECT_EQ(tokenizer.TokenPiece(0), std::string(1, '\0'));
  EXPECT_EQ(tokenizer.TokenPiece(v.im_end), "");
  EXPECT_EQ(tokenizer.TokenPiece(v.im_end, /*render_special=*/true), "<|im_end|>");
  EXPECT_EQ(tokenizer.TokenPiece(v.think), "<think>");
  EXPECT_EQ(tokenizer.TokenPiece(v.pad, true), "");
  EXPECT_EQ(tokenizer.TokenPiece(byte_type, true), "");
  EXPECT_EQ(tokenizer.TokenPiece(-1), "");
  EXPECT_EQ(tokenizer.TokenPiece(tokenizer.vocab_size()), "");
  EXPECT_EQ(tokenizer.TokenBytes(v.im_start), "<|im_start|>");

  const std::vector<int32_t> ids = {v.im_start, hello, v.think, '!', v.pad, v.im_end, 12345678, -5};
  EXPECT_EQ(tokenizer.Decode(ids), " hello<think>!");
  EXPECT_EQ(tokenizer.Decode(ids, /*render_special=*/true), "<|im_start|> hello<think>!<|im_end|>");
  std::string streamed;
  for (int32_t id : ids) streamed += tokenizer.TokenPiece(id);
  EXPECT_EQ(streamed, tokenizer.Decode(ids));
}

TEST(DecodeTest, UnmappableCharactersInNormalTokensAreSpelledOutAsLlamaCppDoes) {
  TokenizerVocab vocab = ByteVocab();
  const int32_t odd = AddToken(vocab, "a\xE4\xB8\xAD");  // "a中": 中 is no bytes_to_unicode character
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_EQ(tokenizer.TokenPiece(odd), "a[UNK_BYTE_0xe4b8ada\xE4\xB8\xAD]");
}

// ---------------------------------------------------------------------------------------------
// Vocabulary validation.

TEST(CreateTest, RejectsInconsistentVocabularies) {
  {
    TokenizerVocab vocab = ByteVocab();
    vocab.tokens['A'] = "not A";
    const absl::Status status = Tokenizer::Create(vocab).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("0x41"));
  }
  {
    TokenizerVocab vocab = ByteVocab();
    vocab.token_types.pop_back();
    EXPECT_EQ(Tokenizer::Create(vocab).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    TokenizerVocab vocab = ByteVocab();
    vocab.pre = "llama3";
    const absl::Status status = Tokenizer::Create(vocab).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("llama3"));
  }
  {
    TokenizerVocab vocab = ByteVocab();
    vocab.bos_id = 256;
    EXPECT_EQ(Tokenizer::Create(vocab).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    TokenizerVocab vocab = ByteVocab();
    vocab.eos_id = -2;
    EXPECT_EQ(Tokenizer::Create(vocab).status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    TokenizerVocab vocab = ByteVocab();
    vocab.add_bos = true;
    EXPECT_EQ(Tokenizer::Create(vocab).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Tokenizer::Create(TokenizerVocab{}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CreateTest, ToleratesWhatLlamaCppTolerates) {
  TokenizerVocab vocab = ByteVocab();
  vocab.token_types.clear();  // no tokenizer.ggml.token_type: all NORMAL
  const int32_t first = AddToken(vocab, "dup");
  const int32_t second = AddToken(vocab, "dup");
  vocab.token_types.clear();
  const int32_t empty = static_cast<int32_t>(vocab.tokens.size());
  vocab.tokens.push_back("");
  vocab.pre = "deepseek-r1-qwen";
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_EQ(tokenizer.vocab_size(), 259);
  EXPECT_EQ(tokenizer.TokenId("dup"), second);
  EXPECT_EQ(tokenizer.TokenText(first), "dup");
  EXPECT_EQ(tokenizer.GetTokenType(first), TokenType::kNormal);
  EXPECT_EQ(tokenizer.TokenText(empty), "[EMPTY_258]");
  EXPECT_EQ(tokenizer.TokenId("nope"), -1);
}

TEST(CreateTest, BosAndEos) {
  TokenizerVocab vocab = ByteVocab();
  const int32_t bos = AddToken(vocab, "<s>", TokenType::kControl);
  const int32_t eos = AddToken(vocab, "</s>", TokenType::kControl);
  vocab.bos_id = bos;
  vocab.eos_id = eos;
  {
    const Tokenizer tokenizer = MustCreate(vocab);
    EXPECT_EQ(tokenizer.bos_id(), bos);
    EXPECT_EQ(tokenizer.eos_id(), eos);
    EXPECT_FALSE(tokenizer.add_bos());
    EXPECT_THAT(tokenizer.Encode("a", true, /*add_special=*/true), ElementsAre('a'));
  }
  vocab.add_bos = true;
  vocab.add_eos = true;
  const Tokenizer tokenizer = MustCreate(vocab);
  EXPECT_TRUE(tokenizer.add_bos());
  EXPECT_THAT(tokenizer.Encode("a", true, /*add_special=*/true), ElementsAre(bos, 'a', eos));
  EXPECT_THAT(tokenizer.Encode("", true, /*add_special=*/true), ElementsAre(bos, eos));
  EXPECT_THAT(tokenizer.Encode("a"), ElementsAre('a'));
}

// ---------------------------------------------------------------------------------------------
// Round trips on the synthetic vocabulary.

TEST(RoundTripTest, Samples) {
  using namespace std::string_literals;
  const Tokenizer& tokenizer = Synthetic();
  const std::vector<std::string> samples = {
      "Hello, world!",
      "The quick brown fox jumps over the lazy dog.",
      "def f(x):\n    return x * 2\n\n\nclass A:\n\tpass\n",
      "int main() {\r\n  return 0;\r\n}\r\n",
      "   leading and trailing   ",
      "\t\t\n\n\n    \n \r\n\v\f",
      "0123456789 3.14159 -42 1e10 0xDEADBEEF 2024-05-01",
      "I'm sure we'll've done it; DON'T you think they're right? It's John's.",
      "\xE6\x9D\xB1\xE4\xBA\xAC\xE3\x81\xAF\xE6\x97\xA5\xE6\x9C\xAC\xE3\x81\xAE\xE9\xA6\x96\xE9\x83\xBD",
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82",
      "emoji \xF0\x9F\x99\x82\xF0\x9F\x9A\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE2\x9D\xA4\xEF\xB8\x8F",
      "caf\xC3\xA9 na\xC3\xAFve e\xCC\x81 \xC2\xA0nbsp\xE3\x80\x80ideographic",
      "nul\0byte and \x01\x7F controls"s,  // std::string literal: keeps the NUL
  };
  for (const std::string& text : samples) {
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    EXPECT_EQ(tokenizer.Decode(ids), text) << text;
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tokenizer.vocab_size());
  }
}

TEST(RoundTripTest, SpecialTokensRenderWhenAsked) {
  const Tokenizer& tokenizer = Synthetic();
  const std::string text = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n";
  const std::vector<int32_t> ids = tokenizer.Encode(text);
  const int32_t im_start = tokenizer.TokenId("<|im_start|>");
  ASSERT_GE(im_start, 0);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(tokenizer.Decode(ids, /*render_special=*/true), text);
  EXPECT_EQ(tokenizer.Decode(ids), "user\nHi there\nassistant\n");
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text, /*parse_special=*/false)), text);
}

TEST(RoundTripTest, RandomValidUtf8) {
  const Tokenizer& tokenizer = Synthetic();
  std::mt19937 rng(1234);
  const uint32_t pool[] = {'a', 'Z',  ' ',  ' ',    '\n',   '\t',    '\r',  '7',    '\'', 's',   '.',
                           '!', 0xE9, 0xA0, 0x3000, 0x4E2D, 0x1F642, 0x301, 0xFF11, 0x85, 0x2028};
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int len = static_cast<int>(rng() % 64);
    for (int i = 0; i < len; ++i) {
      const uint32_t cp = rng() % 3 == 0 ? rng() % 0x800 : pool[rng() % std::size(pool)];
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      unicode::AppendUtf8(cp, &text);
    }
    ASSERT_EQ(tokenizer.Decode(tokenizer.Encode(text)), text);
  }
}

TEST(RoundTripTest, ArbitraryBytesDecodeToTheirCanonicalForm) {
  // Invalid UTF-8 is tokenized as llama.cpp does, each invalid byte as U+FFFD: the round trip gives
  // the canonical form, and is exact for valid UTF-8.
  const Tokenizer& tokenizer = Synthetic();
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode("a\xFF\xFE b\xC3")), "a\xEF\xBF\xBD\xEF\xBF\xBD b\xEF\xBF\xBD");
  std::mt19937 rng(99);
  for (int round = 0; round < 500; ++round) {
    std::string text;
    const int len = static_cast<int>(rng() % 48);
    for (int i = 0; i < len; ++i) text.push_back(static_cast<char>(rng() % 4 == 0 ? rng() % 128 : rng() % 256));
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    ASSERT_EQ(tokenizer.Decode(ids, /*render_special=*/true), unicode::Canonicalize(text));
  }
}

TEST(RoundTripTest, CorpusCompresses) {
  const Tokenizer& tokenizer = Synthetic();
  const std::string_view corpus = SyntheticVocabCorpus();
  const std::vector<int32_t> ids = tokenizer.Encode(corpus);
  EXPECT_EQ(tokenizer.Decode(ids), corpus);
  EXPECT_LT(ids.size() * 2, corpus.size());  // the merges learned from the corpus pay off on it
}

// ---------------------------------------------------------------------------------------------
// Speed: 1 MiB inputs of several shapes must encode in well under 2 s.

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

TEST(SpeedTest, OneMebibyteInputs) {
  const Tokenizer& tokenizer = Synthetic();
  constexpr size_t kSize = 1 << 20;
  std::string prose;
  while (prose.size() < kSize) prose += SyntheticVocabCorpus();
  prose.resize(kSize);
  prose = unicode::Canonicalize(prose);  // the cut may split a character
  std::string chat;
  while (chat.size() < kSize) chat += "<|im_start|>user\nWhat's 2+2?<|im_end|>\n";
  const std::vector<std::pair<const char*, std::string>> inputs = {
      {"prose", prose},
      {"chat", chat},
      {"letters", std::string(kSize, 'e')},
      {"spaces", std::string(kSize, ' ')},
      {"digits", std::string(kSize, '7')},
      {"punctuation", std::string(kSize, '!')},
      {"newlines", std::string(kSize, '\n')},
  };
  for (const auto& [name, text] : inputs) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("encode 1 MiB of %-11s: %7.3f s, %8zu tokens\n", name, seconds, ids.size());
    EXPECT_EQ(tokenizer.Decode(ids, true), text) << name;
    if (!kSanitized) {
      EXPECT_LT(seconds, 2.0) << name;
    }
  }
}

}  // namespace
}  // namespace mer
