#include "common/chat/tool_calls.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace mer {
namespace {

struct Split {
  std::string content;
  std::vector<ToolCall> calls;
};

// Feeds `text` in pieces of `piece` bytes, then finishes.
Split Stream(const std::string& text, size_t piece) {
  ToolCallStream s;
  Split out;
  auto take = [&](ToolCallStream::Delta d) {
    out.content += d.content;
    for (ToolCall& c : d.calls) out.calls.push_back(std::move(c));
  };
  for (size_t i = 0; i < text.size(); i += piece) take(s.Append(std::string_view(text).substr(i, piece)));
  take(s.Finish());
  return out;
}

TEST(ToolCallStream, CallsComeApartFromTheTextAtAnyChunking) {
  const std::string reply =
      "Let me look that up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n";
  for (size_t piece : {1, 2, 3, 7, 64, 1000}) {
    const Split s = Stream(reply, piece);
    EXPECT_EQ(s.content, "Let me look that up.") << piece;
    ASSERT_EQ(s.calls.size(), 2u) << piece;
    EXPECT_EQ(s.calls[0].name, "get_weather");
    EXPECT_EQ(s.calls[0].arguments, "{\"city\":\"Paris\",\"unit\":\"c\"}");
    EXPECT_EQ(s.calls[1].name, "get_time");
    EXPECT_EQ(s.calls[1].arguments, "{}");
  }
}

TEST(ToolCallStream, TextWithoutCallsIsUnchanged) {
  for (const std::string text : {"plain text", "a < b and <tool but not a call", "ends in <tool_c", "  spaced  \n"}) {
    for (size_t piece : {1, 4, 100}) {
      const Split s = Stream(text, piece);
      EXPECT_EQ(s.content, text) << piece;
      EXPECT_TRUE(s.calls.empty());
    }
  }
}

TEST(ToolCallStream, WhatIsNotACallStaysText) {
  // Not JSON, no name, an unclosed block: the model's text as written.
  for (const std::string text : {"<tool_call>not json</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>",
                                 "x <tool_call>{\"name\": \"f\"", "<tool_call>[1, 2]</tool_call>"}) {
    const Split s = Stream(text, 3);
    EXPECT_EQ(s.content, text);
    EXPECT_TRUE(s.calls.empty());
  }
}

TEST(ToolCallStream, ArgumentsGivenAsTextOrLeftOut) {
  const Split s = Stream(
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
      "<tool_call>{\"name\": \"g\"}</tool_call>after",
      5);
  ASSERT_EQ(s.calls.size(), 2u);
  EXPECT_EQ(s.calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(s.calls[1].arguments, "{}");
  EXPECT_EQ(s.content, "after");
}

TEST(ToolCallStream, EveryDeltaIsFinal) {
  // Text before a tag that is still arriving is held, never sent and then taken back.
  ToolCallStream s;
  EXPECT_EQ(s.Append("Sure.").content, "Sure.");
  EXPECT_EQ(s.Append(" \n<tool").content, "");
  const ToolCallStream::Delta d = s.Append("_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
  EXPECT_EQ(d.content, "");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(s.calls(), 1);
  EXPECT_EQ(s.Finish().content, "");
}

}  // namespace
}  // namespace mer
