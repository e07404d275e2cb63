// The Qwen3 chat template (common/chat/chat_template.cc's Qwen3ChatTemplate, written down from the
// chat_template of Qwen/Qwen3-30B-A3B's and Qwen/Qwen3-8B's tokenizer_config.json) rendered for
// 15 conversations: system prompts, multi-turn history, thinking on and off, reasoning in history,
// tool calls. Each expected render was produced by the reference renderer, jinja2 configured as
// Hugging Face transformers' apply_chat_template configures it (reference_render.py in this
// folder, jinja2 3.1), and is pinned here byte for byte; chat_template_reference_test compares
// the two renderers on many more inputs wherever jinja2 is installed.
#include "common/chat/chat_template.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace mer {
namespace {

struct Case {
  const char* name;
  const char* messages;  // JSON
  const char* tools;     // JSON, or "" for none
  std::optional<bool> enable_thinking;
  bool add_generation_prompt;
  const char* expected;
};

const Case kCases[] = {
    {"OneUserTurn", R"JSON([{"role": "user", "content": "What is 2+2?"}])JSON", "", std::nullopt, true,
     R"EXP(<|im_start|>user
What is 2+2?<|im_end|>
<|im_start|>assistant
)EXP"},
    {"OneUserTurnThinkingOff", R"JSON([{"role": "user", "content": "What is 2+2?"}])JSON", "", false, true,
     R"EXP(<|im_start|>user
What is 2+2?<|im_end|>
<|im_start|>assistant
<think>

</think>

)EXP"},
    {"ThinkingOnExplicitly", R"JSON([{"role": "user", "content": "Hi"}])JSON", "", true, true,
     R"EXP(<|im_start|>user
Hi<|im_end|>
<|im_start|>assistant
)EXP"},
    {"SystemAndUser",
     R"JSON([{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello"}])JSON",
     "", std::nullopt, true,
     R"EXP(<|im_start|>system
You are a helpful assistant.<|im_end|>
<|im_start|>user
Hello<|im_end|>
<|im_start|>assistant
)EXP"},
    {"SystemAndUserThinkingOff",
     R"JSON([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])JSON", "", false, true,
     R"EXP(<|im_start|>system
Be brief.<|im_end|>
<|im_start|>user
Hello<|im_end|>
<|im_start|>assistant
<think>

</think>

)EXP"},
    {"MultiTurnHistory",
     R"JSON([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}])JSON",
     "", std::nullopt, true,
     R"EXP(<|im_start|>user
Hi<|im_end|>
<|im_start|>assistant
Hello! How can I help?<|im_end|>
<|im_start|>user
Tell me a joke.<|im_end|>
<|im_start|>assistant
)EXP"},
    {"MultiTurnDropsOldReasoning",
     R"JSON([{"role": "system", "content": "sys"}, {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nA1"}, {"role": "user", "content": "Q2"}])JSON",
     "", std::nullopt, true,
     R"EXP(<|im_start|>system
sys<|im_end|>
<|im_start|>user
Q1<|im_end|>
<|im_start|>assistant
A1<|im_end|>
<|im_start|>user
Q2<|im_end|>
<|im_start|>assistant
)EXP"},
    {"ThreeTurnsThinkingOff",
     R"JSON([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}])JSON",
     "", false, true,
     R"EXP(<|im_start|>user
a<|im_end|>
<|im_start|>assistant
b<|im_end|>
<|im_start|>user
c<|im_end|>
<|im_start|>assistant
d<|im_end|>
<|im_start|>user
e<|im_end|>
<|im_start|>assistant
<think>

</think>

)EXP"},
    {"LastAssistantKeepsReasoningContent",
     R"JSON([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "\nsteps\n"}])JSON",
     "", std::nullopt, false,
     R"EXP(<|im_start|>user
Q<|im_end|>
<|im_start|>assistant
<think>
steps
</think>

A<|im_end|>
)EXP"},
    {"LastAssistantReasoningFromContent",
     R"JSON([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nR\n</think>\n\nA"}])JSON", "",
     std::nullopt, false,
     R"EXP(<|im_start|>user
Q<|im_end|>
<|im_start|>assistant
<think>
R
</think>

A<|im_end|>
)EXP"},
    {"LastAssistantWithoutReasoning",
     R"JSON([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}])JSON", "", std::nullopt, false,
     R"EXP(<|im_start|>user
Q<|im_end|>
<|im_start|>assistant
<think>

</think>

A<|im_end|>
)EXP"},
    {"SecondSystemMessageIsATurn",
     R"JSON([{"role": "system", "content": "first"}, {"role": "user", "content": "u"}, {"role": "system", "content": "second"}, {"role": "user", "content": "v"}])JSON",
     "", std::nullopt, true,
     R"EXP(<|im_start|>system
first<|im_end|>
<|im_start|>user
u<|im_end|>
<|im_start|>system
second<|im_end|>
<|im_start|>user
v<|im_end|>
<|im_start|>assistant
)EXP"},
    {"UnicodeAndNewlines", R"JSON([{"role": "user", "content": "Grüße, 你好 ✓\n\nTwo lines\n"}])JSON", "", std::nullopt,
     true,
     R"EXP(<|im_start|>user
Grüße, 你好 ✓

Two lines
<|im_end|>
<|im_start|>assistant
)EXP"},
    {"EmptyUserContent", R"JSON([{"role": "user", "content": ""}])JSON", "", std::nullopt, true,
     R"EXP(<|im_start|>user
<|im_end|>
<|im_start|>assistant
)EXP"},
    {"ToolsCallsAndResponses",
     R"JSON([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]}, {"role": "tool", "content": "{\"t\": 21}"}, {"role": "tool", "content": "{\"rain\": false}"}])JSON",
     R"JSON([{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])JSON",
     std::nullopt, true,
     R"EXP(<|im_start|>system
Use tools.

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{"type": "function", "function": {"name": "get_weather", "description": "Current weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
<|im_start|>user
Weather in Paris?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
{"t": 21}
</tool_response>
<tool_response>
{"rain": false}
</tool_response><|im_end|>
<|im_start|>assistant
)EXP"},
};

TEST(ChatTemplateTest, Qwen3RendersLikeTheReference) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(Qwen3ChatTemplate());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->has_reasoning());
  for (const Case& c : kCases) {
    ChatTemplateInputs in;
    in.messages = nlohmann::ordered_json::parse(c.messages);
    if (*c.tools) in.tools = nlohmann::ordered_json::parse(c.tools);
    in.enable_thinking = c.enable_thinking;
    in.add_generation_prompt = c.add_generation_prompt;
    absl::StatusOr<std::string> got = t->Render(in);
    ASSERT_TRUE(got.ok()) << c.name << ": " << got.status();
    EXPECT_EQ(*got, c.expected) << c.name;
  }
}

TEST(ChatTemplateTest, RenderErrorsAreInvalidArgument) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse("{{ raise_exception('only user turns') }}");
  ASSERT_TRUE(t.ok());
  const absl::Status s = t->Render({}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("only user turns"), std::string::npos) << s;
  EXPECT_EQ(ChatTemplate::Parse("{% macro m() %}{% endmacro %}").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::Parse("{% if x %}").status().code(), absl::StatusCode::kInvalidArgument);
  // Limits: a loop that would run for ever is cut off, deep nesting does not parse.
  t = ChatTemplate::Parse("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->Render({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ChatTemplate::Parse("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A namespace that would hold itself is refused where it is assigned: the cycle would leak and
// have every printer and comparison recurse without end. Sharing without a cycle still renders.
TEST(ChatTemplateTest, NamespaceThatWouldHoldItselfIsAnError) {
  for (const char* cycle : {
           "{% set ns = namespace(n=0) %}{% set ns.n = ns %}{{ ns.n }}",
           "{% set ns = namespace(l=[]) %}{% set ns.l = [1, {'k': [ns]}] %}{{ ns.l }}",
           "{% set a = namespace() %}{% set b = namespace(x=a) %}{% set a.y = b %}{{ a }}",
       }) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(cycle);
    ASSERT_TRUE(t.ok()) << cycle;
    const absl::Status s = t->Render({}).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << cycle;
    EXPECT_NE(s.message().find("a cycle"), std::string::npos) << s;
  }
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(
      "{% set l = [1, 2] %}{% set a = namespace(x=l) %}{% set b = namespace(p=a, q=a) %}"
      "{% set a.y = [l, l] %}{% set b.r = b.p %}{{ b.r.y }}{{ b.q.x }}");
  ASSERT_TRUE(t.ok());
  absl::StatusOr<std::string> out = t->Render({});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "[[1, 2], [1, 2]][1, 2]");
}

// Feeds `text` in pieces of `step` bytes; returns (reasoning, content).
std::pair<std::string, std::string> Split(std::string_view text, size_t step, bool starts_in_reasoning = false) {
  ReasoningStream s(starts_in_reasoning);
  std::string reasoning, content;
  for (size_t i = 0; i < text.size(); i += step) {
    const ReasoningStream::Delta d = s.Append(text.substr(i, step));
    reasoning += d.reasoning;
    content += d.content;
  }
  const ReasoningStream::Delta d = s.Finish();
  return {reasoning + d.reasoning, content + d.content};
}

TEST(ReasoningStreamTest, SplitsThinkBlocksWhateverTheChunking) {
  for (size_t step : {1, 2, 3, 7, 100}) {
    EXPECT_EQ(Split("<think>\nI should add.\n</think>\n\n4", step),
              (std::pair<std::string, std::string>{"I should add.", "4"}))
        << step;
    EXPECT_EQ(Split("  \n<think></think>\n\nHello", step), (std::pair<std::string, std::string>{"", "Hello"})) << step;
    EXPECT_EQ(Split("Plain answer <think> later", step),
              (std::pair<std::string, std::string>{"", "Plain answer <think> later"}))
        << step;
    EXPECT_EQ(Split("<think>\ncut off mid-thought\n", step),
              (std::pair<std::string, std::string>{"cut off mid-thought", ""}))
        << step;
    EXPECT_EQ(Split("<thin", step), (std::pair<std::string, std::string>{"", "<thin"})) << step;
    EXPECT_EQ(Split("a </thi b</think>c", step, true), (std::pair<std::string, std::string>{"a </thi b", "c"})) << step;
    EXPECT_EQ(Split("<think>x\n\ny</think>", step), (std::pair<std::string, std::string>{"x\n\ny", ""})) << step;
  }
  EXPECT_TRUE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n"));
}

}  // namespace
}  // namespace mer
