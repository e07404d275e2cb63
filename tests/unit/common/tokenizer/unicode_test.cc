#include "common/tokenizer/unicode.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mer::unicode {
namespace {

using ::testing::ElementsAre;

std::vector<uint32_t> DecodeAll(std::string_view text) {
  std::vector<uint32_t> cpts;
  Decode(text, &cpts);
  return cpts;
}

TEST(ByteToUnicodeTest, MatchesGpt2Mapping) {
  EXPECT_EQ(ByteToUnicode('A'), uint32_t{'A'});
  EXPECT_EQ(ByteToUnicode('!'), uint32_t{'!'});
  EXPECT_EQ(ByteToUnicode('~'), uint32_t{'~'});
  EXPECT_EQ(ByteToUnicode(0xA1), 0xA1u);
  EXPECT_EQ(ByteToUnicode(0xFF), 0xFFu);
  EXPECT_EQ(ByteToUnicode(0x00), 0x100u);
  EXPECT_EQ(ByteToUnicode(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(ByteToUnicode('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToUnicode(0x7F), 0x121u);
  EXPECT_EQ(ByteToUnicode(0xA0), 0x142u);
  EXPECT_EQ(ByteToUnicode(0xAD), 0x143u);
  EXPECT_EQ(ByteToken(' '), "\xC4\xA0");
}

TEST(ByteToUnicodeTest, IsABijectionWithItsInverse) {
  std::vector<bool> seen(0x144, false);
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = ByteToUnicode(static_cast<uint8_t>(b));
    ASSERT_LT(cp, 0x144u);
    EXPECT_FALSE(seen[cp]) << b;
    seen[cp] = true;
    EXPECT_EQ(UnicodeToByte(cp), b);
  }
  EXPECT_EQ(UnicodeToByte(' '), -1);  // space is not printable in GPT-2's sense
  EXPECT_EQ(UnicodeToByte(0x144), -1);
  EXPECT_EQ(UnicodeToByte(0x4E2D), -1);
}

TEST(Utf8Test, DecodesValidSequences) {
  EXPECT_THAT(DecodeAll("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x99\x82"), ElementsAre('a', 0xE9, 0x4E2D, 0x1F642));
  EXPECT_THAT(DecodeAll(std::string_view("\0x", 2)), ElementsAre(0, 'x'));
}

TEST(Utf8Test, EachInvalidByteBecomesOneReplacementChar) {
  EXPECT_THAT(DecodeAll("\x80"), ElementsAre(kReplacementChar));
  EXPECT_THAT(DecodeAll("\xFF\xFE"), ElementsAre(kReplacementChar, kReplacementChar));
  EXPECT_THAT(DecodeAll("\xF8\x88\x80\x80\x80"),
              ElementsAre(kReplacementChar, kReplacementChar, kReplacementChar, kReplacementChar, kReplacementChar));
  // Truncated sequences, at the end and before an ASCII byte.
  EXPECT_THAT(DecodeAll("\xE4\xB8"), ElementsAre(kReplacementChar, kReplacementChar));
  EXPECT_THAT(DecodeAll("a\xC3"), ElementsAre('a', kReplacementChar));
  EXPECT_THAT(DecodeAll("\xC3x"), ElementsAre(kReplacementChar, 'x'));
  EXPECT_THAT(DecodeAll("\xF0\x9F\x99"), ElementsAre(kReplacementChar, kReplacementChar, kReplacementChar));
  // Above U+10FFFF.
  EXPECT_THAT(DecodeAll("\xF4\x90\x80\x80"),
              ElementsAre(kReplacementChar, kReplacementChar, kReplacementChar, kReplacementChar));
}

TEST(Utf8Test, AcceptsOverlongFormsAndSurrogatesAsLlamaCppDoes) {
  EXPECT_THAT(DecodeAll("\xC0\xAF"), ElementsAre('/'));
  EXPECT_THAT(DecodeAll("\xE0\x80\x80"), ElementsAre(0));
  EXPECT_THAT(DecodeAll("\xED\xA0\x80"), ElementsAre(0xD800));
  EXPECT_EQ(Canonicalize("\xC0\xAF"), "/");
  EXPECT_EQ(Canonicalize("\xED\xA0\x80"), "\xED\xA0\x80");
}

TEST(Utf8Test, AppendUtf8RoundTripsEveryCodepoint) {
  for (uint32_t cp = 0; cp <= kMaxCodepoint; cp += (cp < 0x20000 ? 1 : 97)) {
    std::string text;
    AppendUtf8(cp, &text);
    size_t offset = 0;
    ASSERT_EQ(DecodeOne(text, &offset), cp);
    ASSERT_EQ(offset, text.size());
  }
}

TEST(Utf8Test, CanonicalizeIsIdentityOnValidUtf8) {
  const std::string text = "plain ASCII, caf\xC3\xA9, \xE6\x9D\xB1\xE4\xBA\xAC, \xF0\x9F\x9A\x80";
  EXPECT_EQ(Canonicalize(text), text);
  EXPECT_EQ(Canonicalize("a\xFF"
                         "b"),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(ClassifyTest, AsciiMatchesCLocale) {
  for (uint32_t c = 0; c < 128; ++c) {
    CodepointClass want = CodepointClass::kOther;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) want = CodepointClass::kLetter;
    if (c >= '0' && c <= '9') want = CodepointClass::kNumber;
    if (c == ' ' || (c >= 9 && c <= 13)) want = CodepointClass::kSpace;
    EXPECT_EQ(Classify(c), want) << c;
  }
}

TEST(ClassifyTest, NonAscii) {
  EXPECT_EQ(Classify(0x85), CodepointClass::kSpace);    // NEXT LINE
  EXPECT_EQ(Classify(0xA0), CodepointClass::kSpace);    // NO-BREAK SPACE
  EXPECT_EQ(Classify(0x2028), CodepointClass::kSpace);  // LINE SEPARATOR
  EXPECT_EQ(Classify(0x3000), CodepointClass::kSpace);  // IDEOGRAPHIC SPACE
  EXPECT_EQ(Classify(0x200B), CodepointClass::kOther);  // ZERO WIDTH SPACE is Cf, not White_Space
  EXPECT_EQ(Classify(0x180E), CodepointClass::kOther);
  EXPECT_EQ(Classify(0xE9), CodepointClass::kLetter);     // é
  EXPECT_EQ(Classify(0xAA), CodepointClass::kLetter);     // ª (Lo)
  EXPECT_EQ(Classify(0x4E2D), CodepointClass::kLetter);   // 中
  EXPECT_EQ(Classify(0x3042), CodepointClass::kLetter);   // あ
  EXPECT_EQ(Classify(0x20000), CodepointClass::kLetter);  // CJK extension B
  EXPECT_EQ(Classify(0x0663), CodepointClass::kNumber);   // ARABIC-INDIC DIGIT THREE (Nd)
  EXPECT_EQ(Classify(0xBD), CodepointClass::kNumber);     // ½ (No)
  EXPECT_EQ(Classify(0x216B), CodepointClass::kNumber);   // ROMAN NUMERAL TWELVE (Nl)
  EXPECT_EQ(Classify(0xFF11), CodepointClass::kNumber);   // FULLWIDTH DIGIT ONE
  EXPECT_EQ(Classify(0x0301), CodepointClass::kOther);    // combining acute (Mn)
  EXPECT_EQ(Classify(0x1F642), CodepointClass::kOther);   // 🙂 (So)
  EXPECT_EQ(Classify(0xFF0C), CodepointClass::kOther);    // FULLWIDTH COMMA (Po)
  EXPECT_EQ(Classify(0xFFFD), CodepointClass::kOther);
  EXPECT_EQ(Classify(0xD800), CodepointClass::kOther);
  EXPECT_EQ(Classify(0x10FFFF), CodepointClass::kOther);
}

TEST(ClassifyTest, TableIsSortedAndDisjoint) {
  using tokenizer_internal::kCodepointRangeCount;
  using tokenizer_internal::kCodepointRanges;
  ASSERT_GT(kCodepointRangeCount, 500u);
  for (size_t i = 0; i < kCodepointRangeCount; ++i) {
    EXPECT_LE(kCodepointRanges[i].first, kCodepointRanges[i].last);
    EXPECT_LE(kCodepointRanges[i].last, kMaxCodepoint);
    EXPECT_NE(kCodepointRanges[i].cls, CodepointClass::kOther);
    if (i > 0) {
      EXPECT_LT(kCodepointRanges[i - 1].last, kCodepointRanges[i].first);
    }
  }
}

}  // namespace
}  // namespace mer::unicode
