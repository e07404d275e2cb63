#include "common/tokenizer/pretokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Every expectation below was derived by hand from the regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with leftmost-first alternation, as std::regex (llama.cpp) and Python's regex run it.

TEST(PreTokenizeQwen2Test, Empty) { EXPECT_THAT(PreTokenizeQwen2(""), IsEmpty()); }

TEST(PreTokenizeQwen2Test, WordsPunctuationNewlinesSpacesDigits) {
  EXPECT_THAT(PreTokenizeQwen2("Hello world!!\n\n  x 123"),
              ElementsAre("Hello", " world", "!!\n\n", " ", " x", " ", "1", "2", "3"));
}

TEST(PreTokenizeQwen2Test, Contractions) {
  EXPECT_THAT(PreTokenizeQwen2("I'm"), ElementsAre("I", "'m"));
  EXPECT_THAT(PreTokenizeQwen2("don't"), ElementsAre("don", "'t"));
  EXPECT_THAT(PreTokenizeQwen2("DON'T"), ElementsAre("DON", "'T"));
  EXPECT_THAT(PreTokenizeQwen2("we'll've"), ElementsAre("we", "'ll", "'ve"));
  EXPECT_THAT(PreTokenizeQwen2("they'RE here"), ElementsAre("they", "'RE", " here"));
  EXPECT_THAT(PreTokenizeQwen2("it's'd"), ElementsAre("it", "'s", "'d"));
  // A contraction wins over the letter run it prefixes.
  EXPECT_THAT(PreTokenizeQwen2("'sand"), ElementsAre("'s", "and"));
  // Not a contraction: the apostrophe leads the letter run, or joins other punctuation.
  EXPECT_THAT(PreTokenizeQwen2("'x"), ElementsAre("'x"));
  EXPECT_THAT(PreTokenizeQwen2("rock 'n' roll"), ElementsAre("rock", " '", "n", "'", " roll"));
  EXPECT_THAT(PreTokenizeQwen2("''"), ElementsAre("''"));
  EXPECT_THAT(PreTokenizeQwen2("'"), ElementsAre("'"));
}

TEST(PreTokenizeQwen2Test, NumbersAreSingleDigits) {
  EXPECT_THAT(PreTokenizeQwen2("12345"), ElementsAre("1", "2", "3", "4", "5"));
  EXPECT_THAT(PreTokenizeQwen2("x1"), ElementsAre("x", "1"));
  EXPECT_THAT(PreTokenizeQwen2("a 1b"), ElementsAre("a", " ", "1", "b"));
  EXPECT_THAT(PreTokenizeQwen2("3.14"), ElementsAre("3", ".", "1", "4"));
  EXPECT_THAT(PreTokenizeQwen2("\xEF\xBC\x91\xEF\xBC\x92"), ElementsAre("\xEF\xBC\x91", "\xEF\xBC\x92"));  // １２
  EXPECT_THAT(PreTokenizeQwen2("\xC2\xBD"
                               "cup"),
              ElementsAre("\xC2\xBD", "cup"));  // ½ is \p{N}
}

TEST(PreTokenizeQwen2Test, WhitespaceRunsLeaveTheirLastCharacterToTheNextWord) {
  EXPECT_THAT(PreTokenizeQwen2("a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(PreTokenizeQwen2("a    b"), ElementsAre("a", "   ", " b"));
  EXPECT_THAT(PreTokenizeQwen2("\t\tfoo"), ElementsAre("\t", "\tfoo"));
  EXPECT_THAT(PreTokenizeQwen2("\tfoo"), ElementsAre("\tfoo"));
  // Before a non-letter the last space stays alone (\s+) or leads punctuation (" ?[^\s...]").
  EXPECT_THAT(PreTokenizeQwen2("a  1"), ElementsAre("a", " ", " ", "1"));
  EXPECT_THAT(PreTokenizeQwen2("a  !"), ElementsAre("a", " ", " !"));
  EXPECT_THAT(PreTokenizeQwen2("a\t!"), ElementsAre("a", "\t", "!"));
  // At the end of the text the whole run is one piece.
  EXPECT_THAT(PreTokenizeQwen2("a   "), ElementsAre("a", "   "));
  EXPECT_THAT(PreTokenizeQwen2(" "), ElementsAre(" "));
}

TEST(PreTokenizeQwen2Test, NewlinesEndWhitespaceRuns) {
  EXPECT_THAT(PreTokenizeQwen2("a \n b"), ElementsAre("a", " \n", " b"));
  EXPECT_THAT(PreTokenizeQwen2("\n\nfoo"), ElementsAre("\n\n", "foo"));
  EXPECT_THAT(PreTokenizeQwen2("  \n  \n  x"), ElementsAre("  \n  \n", " ", " x"));
  EXPECT_THAT(PreTokenizeQwen2("a\r\nb"), ElementsAre("a", "\r\n", "b"));
  EXPECT_THAT(PreTokenizeQwen2("x\n"), ElementsAre("x", "\n"));
  EXPECT_THAT(PreTokenizeQwen2("x \n"), ElementsAre("x", " \n"));
  EXPECT_THAT(PreTokenizeQwen2("x\n  "), ElementsAre("x", "\n", "  "));
  // CR/LF never lead a letter run.
  EXPECT_THAT(PreTokenizeQwen2("\nx"), ElementsAre("\n", "x"));
}

TEST(PreTokenizeQwen2Test, Punctuation) {
  EXPECT_THAT(PreTokenizeQwen2("hello, world."), ElementsAre("hello", ",", " world", "."));
  EXPECT_THAT(PreTokenizeQwen2("x !!\n"), ElementsAre("x", " !!\n"));
  EXPECT_THAT(PreTokenizeQwen2("foo()\n\n"), ElementsAre("foo", "()\n\n"));
  EXPECT_THAT(PreTokenizeQwen2(".\r\n"), ElementsAre(".\r\n"));
  EXPECT_THAT(PreTokenizeQwen2("-foo $x (y)"), ElementsAre("-foo", " $", "x", " (", "y", ")"));
  EXPECT_THAT(PreTokenizeQwen2("a->b"), ElementsAre("a", "->", "b"));
  EXPECT_THAT(PreTokenizeQwen2("    return x;"), ElementsAre("   ", " return", " x", ";"));
}

TEST(PreTokenizeQwen2Test, NonAscii) {
  EXPECT_THAT(PreTokenizeQwen2("Caf\xC3\xA9 na\xC3\xAFve"), ElementsAre("Caf\xC3\xA9", " na\xC3\xAFve"));
  // 東京は日本: all \p{L}.
  EXPECT_THAT(PreTokenizeQwen2("\xE6\x9D\xB1\xE4\xBA\xAC\xE3\x81\xAF\xE6\x97\xA5\xE6\x9C\xAC"),
              ElementsAre("\xE6\x9D\xB1\xE4\xBA\xAC\xE3\x81\xAF\xE6\x97\xA5\xE6\x9C\xAC"));
  // 你好，世界！: the fullwidth comma leads the next letter run; the final "！" stands alone.
  EXPECT_THAT(PreTokenizeQwen2("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xEF\xBC\x81"),
              ElementsAre("\xE4\xBD\xA0\xE5\xA5\xBD", "\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C", "\xEF\xBC\x81"));
  // Emoji are neither letters nor numbers.
  EXPECT_THAT(PreTokenizeQwen2("hi \xF0\x9F\x99\x82\xF0\x9F\x9A\x80!"),
              ElementsAre("hi", " \xF0\x9F\x99\x82\xF0\x9F\x9A\x80!"));
  // A combining mark is not \p{L} in qwen2's regex: it splits from its base letter.
  EXPECT_THAT(PreTokenizeQwen2("e\xCC\x81t\xC3\xA9"), ElementsAre("e", "\xCC\x81t\xC3\xA9"));
  // NO-BREAK SPACE is whitespace and, like a space, leads a word.
  EXPECT_THAT(PreTokenizeQwen2("a\xC2\xA0"
                               "b"),
              ElementsAre("a",
                          "\xC2\xA0"
                          "b"));
  EXPECT_THAT(PreTokenizeQwen2("a\xC2\xA0\xC2\xA0"
                               "b"),
              ElementsAre("a", "\xC2\xA0",
                          "\xC2\xA0"
                          "b"));
}

TEST(PreTokenizeQwen2Test, InvalidUtf8BecomesReplacementCharacters) {
  EXPECT_THAT(PreTokenizeQwen2("a\xFF"
                               "b"),
              ElementsAre("a",
                          "\xEF\xBF\xBD"
                          "b"));
  EXPECT_THAT(PreTokenizeQwen2("\xC3"), ElementsAre("\xEF\xBF\xBD"));
  EXPECT_THAT(PreTokenizeQwen2("\x80\x80 x"), ElementsAre("\xEF\xBF\xBD\xEF\xBF\xBD", " x"));
}

TEST(PreTokenizeQwen2Test, PiecesCoverTheText) {
  const std::string text =
      "int main() {\n\treturn 0;  // done\n}\n\n\n  Mixed \xE2\x80\x94 text\xE2\x80\xA6 with\xC2\xA0odd   spacing\r\n";
  std::string joined;
  for (const std::string& piece : PreTokenizeQwen2(text)) {
    EXPECT_FALSE(piece.empty());
    joined += piece;
  }
  EXPECT_EQ(joined, text);
}

}  // namespace
}  // namespace mer
