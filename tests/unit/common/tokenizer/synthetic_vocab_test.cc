#include <set>
#include <string>

#include "common/tokenizer/tokenizer.h"
#include "common/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

constexpr int32_t kNormal = static_cast<int32_t>(TokenType::kNormal);
constexpr int32_t kControl = static_cast<int32_t>(TokenType::kControl);
constexpr int32_t kUnused = static_cast<int32_t>(TokenType::kUnused);

TEST(SyntheticVocabTest, IsDeterministic) {
  const TokenizerVocab a = MakeSyntheticVocab(1024, 600);
  const TokenizerVocab b = MakeSyntheticVocab(1024, 600);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.token_types, b.token_types);
  EXPECT_EQ(a.merges, b.merges);
  // A smaller request is a prefix of a larger one: the trainer's choices do not depend on the limits.
  const TokenizerVocab c = MakeSyntheticVocab(1024, 300);
  ASSERT_EQ(c.merges.size(), 300u);
  EXPECT_TRUE(std::equal(c.merges.begin(), c.merges.end(), a.merges.begin()));
}

TEST(SyntheticVocabTest, HasQwenShape) {
  const int32_t kVocabSize = 1000;
  const TokenizerVocab vocab = MakeSyntheticVocab(kVocabSize, 500);
  ASSERT_EQ(vocab.tokens.size(), size_t{kVocabSize});
  ASSERT_EQ(vocab.token_types.size(), size_t{kVocabSize});
  EXPECT_EQ(vocab.pre, "qwen2");
  EXPECT_FALSE(vocab.add_bos);
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(vocab.tokens[b], unicode::ByteToken(static_cast<uint8_t>(b)));
    EXPECT_EQ(vocab.token_types[b], kNormal);
  }
  ASSERT_EQ(vocab.merges.size(), 500u);
  // Each merge adds at most one token (a merge may respell an existing one).
  const int32_t first_special = vocab.bos_id;
  EXPECT_LE(first_special, 256 + 500);
  EXPECT_GT(first_special, 256 + 400);
  for (int32_t id = 256; id < first_special; ++id) EXPECT_EQ(vocab.token_types[id], kNormal);
  EXPECT_EQ(vocab.tokens[first_special], "<|endoftext|>");
  EXPECT_EQ(vocab.tokens[first_special + 1], "<|im_start|>");
  EXPECT_EQ(vocab.tokens[first_special + 2], "<|im_end|>");
  for (int32_t id = first_special; id < first_special + 3; ++id) EXPECT_EQ(vocab.token_types[id], kControl);
  EXPECT_EQ(vocab.eos_id, first_special);
  for (int32_t id = first_special + 3; id < kVocabSize; ++id) {
    EXPECT_EQ(vocab.tokens[id], "[PAD" + std::to_string(id) + "]");
    EXPECT_EQ(vocab.token_types[id], kUnused);
  }
  EXPECT_EQ(std::set<std::string>(vocab.tokens.begin(), vocab.tokens.end()).size(), vocab.tokens.size());
  EXPECT_EQ(std::set<std::string>(vocab.merges.begin(), vocab.merges.end()).size(), vocab.merges.size());
}

TEST(SyntheticVocabTest, IsAValidTokenizerVocabulary) {
  const TokenizerVocab vocab = MakeSyntheticVocab(4096, 4000);
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(vocab);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->vocab_size(), 4096);
  EXPECT_EQ(tokenizer->num_skipped_merges(), 0);
  EXPECT_EQ(tokenizer->num_merges(), static_cast<int32_t>(vocab.merges.size()));
  EXPECT_EQ(tokenizer->bos_id(), tokenizer->TokenId("<|endoftext|>"));
  EXPECT_TRUE(tokenizer->IsEndOfGeneration(tokenizer->TokenId("<|im_end|>")));
  EXPECT_TRUE(tokenizer->IsEndOfGeneration(tokenizer->eos_id()));
  EXPECT_EQ(tokenizer->Decode(tokenizer->Encode(SyntheticVocabCorpus())), SyntheticVocabCorpus());
}

TEST(SyntheticVocabTest, StopsWhenTheCorpusRunsOutOfPairs) {
  const TokenizerVocab vocab = MakeSyntheticVocab(100000, 100000);
  EXPECT_EQ(vocab.tokens.size(), 100000u);
  EXPECT_GT(vocab.merges.size(), 500u);
  EXPECT_LT(vocab.merges.size(), 5000u);
  EXPECT_EQ(vocab.token_types.back(), kUnused);
}

TEST(SyntheticVocabTest, SmallestSizes) {
  const TokenizerVocab tiny = MakeSyntheticVocab(259, 1000);
  EXPECT_EQ(tiny.tokens.size(), 259u);
  EXPECT_TRUE(tiny.merges.empty());
  EXPECT_EQ(tiny.bos_id, 256);
  EXPECT_TRUE(Tokenizer::Create(tiny).ok());

  const TokenizerVocab no_merges = MakeSyntheticVocab(300, 0);
  EXPECT_EQ(no_merges.tokens.size(), 300u);
  EXPECT_TRUE(no_merges.merges.empty());
  EXPECT_EQ(no_merges.tokens[259], "[PAD259]");

  // Room for one merge token only.
  const TokenizerVocab one = MakeSyntheticVocab(260, 1000);
  EXPECT_EQ(one.tokens.size(), 260u);
  EXPECT_EQ(one.merges.size(), 1u);
  EXPECT_EQ(one.bos_id, 257);
}

}  // namespace
}  // namespace mer
