// Tool calls in a chat reply: Qwen3's chat template (like Hermes') tells the model to answer a
// call as <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call. The
// OpenAI-compatible API returns those as `tool_calls`, apart from the text around them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace mer {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's `function.arguments`)
};

// Splits streamed reply content into text and tool calls. Text that may be the start of a
// "<tool_call>" tag (and the whitespace before it) is held until it is decided, and a block until
// it closes, so every delta is final; the whitespace around calls is not content. A block whose body is not a JSON object with a string "name" stays text, as does one
// left open when the reply ends: nothing the model wrote is lost.
class ToolCallStream {
 public:
  struct Delta {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Delta Append(std::string_view text);
  Delta Finish();                       // the held text, as text
  int calls() const { return calls_; }  // tool calls returned so far

 private:
  Delta Run(bool final);

  std::string held_;
  bool in_block_ = false;    // held_ starts inside a <tool_call> block (its tag consumed)
  bool after_call_ = false;  // a call just closed: whitespace up to the next text is dropped
  std::string block_lead_;   // the whitespace before the open block's tag
  int calls_ = 0;
};

// The tool call a block's body describes, if it is one (see ToolCallStream).
bool ParseToolCall(std::string_view body, ToolCall* out);

}  // namespace mer
