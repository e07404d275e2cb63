#include "services/gateway/text_stream.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mer::gateway {
namespace {

// Feeds `pieces` one by one; returns what each Append released, and Finish last.
std::vector<std::string> Feed(TextStream& t, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const auto& p : pieces) out.push_back(t.Append(p));
  out.push_back(t.Finish());
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x;
  return s;
}

TEST(TextStreamTest, NeverSplitsACharacter) {
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80, split at every byte.
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80z";
  TextStream t;
  std::vector<std::string> pieces;
  for (char c : text) pieces.push_back(std::string(1, c));
  const auto out = Feed(t, pieces);
  for (const auto& piece : out) EXPECT_TRUE(IsValidUtf8(piece)) << piece;
  EXPECT_EQ(Join(out), text);
  EXPECT_EQ(out[0], "a");
  EXPECT_EQ(out[1], "");  // C3 alone is held
  EXPECT_EQ(out[2], "\xC3\xA9");
  EXPECT_EQ(out[9], "\xF0\x9F\x98\x80");
}

TEST(TextStreamTest, InvalidBytesBecomeReplacementCharacters) {
  TextStream t;
  // A lone continuation byte, an invalid lead (C0), a lead followed by ASCII, a surrogate.
  const auto out = Feed(t, {"\x80", "x\xC0", "\xE2", "y", "\xED\xA0\x80"});
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(Join(out), r + "x" + r + r + "y" + r + r + r);
  for (const auto& piece : out) EXPECT_TRUE(IsValidUtf8(piece));
}

TEST(TextStreamTest, IncompleteCharacterAtTheEndIsReplaced) {
  TextStream t;
  const auto out = Feed(t, {"ok", "\xF0\x9F"});
  EXPECT_EQ(out[1], "");
  EXPECT_EQ(out[2], "\xEF\xBF\xBD");
}

TEST(TextStreamTest, StopSequenceSpanningTokens) {
  TextStream t({"STOP"});
  const auto out = Feed(t, {"hello S", "T", "O", "P after", "more"});
  EXPECT_EQ(out[0], "hello ");  // "S" could start the stop sequence: held
  EXPECT_EQ(out[1], "");
  EXPECT_EQ(out[2], "");
  EXPECT_EQ(out[3], "");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(Join(out), "hello ");
}

TEST(TextStreamTest, HeldTextIsReleasedWhenItTurnsOutNotToBeAStop) {
  TextStream t({"STOP"});
  const auto out = Feed(t, {"ST", "OX", "y"});
  EXPECT_EQ(out[0], "");
  EXPECT_EQ(out[1], "STOX");
  EXPECT_EQ(Join(out), "STOXy");
  EXPECT_FALSE(t.stopped());
}

TEST(TextStreamTest, EarliestOfSeveralStopsWinsAndHeldPrefixIsFlushedAtTheEnd) {
  TextStream t({"bc", "abcd"});
  EXPECT_EQ(Join(Feed(t, {"xa", "bcd"})), "x");  // "abcd" starts before "bc"
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.stop_sequence(), "abcd");
  TextStream u({"\n\n"});
  EXPECT_EQ(Join(Feed(u, {"line\n"})), "line\n");  // held "\n" comes out at Finish
  EXPECT_FALSE(u.stopped());
}

TEST(TextStreamTest, StopInsideOneTokenAndMultibyteStops) {
  TextStream t({"é"});
  const auto out = Feed(t, {"caf\xC3", "\xA9 ok"});
  EXPECT_EQ(Join(out), "caf");
  EXPECT_TRUE(t.stopped());
}

TEST(Utf8Test, Validity) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("abc\xC3\xA9\xF4\x8F\xBF\xBF"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_FALSE(IsValidUtf8("\xC1\x81"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xE0\x80\x80"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsValidUtf8("\xFF"));
}

}  // namespace
}  // namespace mer::gateway
