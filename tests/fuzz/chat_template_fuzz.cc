// libFuzzer target for the chat-template renderer (common/chat/jinja.h), which parses the
// tokenizer.chat_template of any GGUF file a user loads. The input is a template; it is parsed
// and rendered for a fixed conversation with tools. Checks: parsing and rendering return a status
// (no crash, no hang: the renderer's limits bound loops, nesting and output), and a render fits
// the output limit.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/check.h"
#include "common/chat/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mer::ChatTemplateInputs* const inputs = [] {
    auto* in = new mer::ChatTemplateInputs;
    in->messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "Hi <tool_response>"},
      {"role": "assistant", "content": "<think>\nr\n</think>\n\nA", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1.5, "y": [true, null]}}}]},
      {"role": "tool", "content": "42"},
      {"role": "user", "content": "ünï"}])");
    in->tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
    in->enable_thinking = false;
    return in;
  }();
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  const absl::StatusOr<mer::ChatTemplate> t = mer::ChatTemplate::Parse(source);
  if (!t.ok()) return 0;
  const absl::StatusOr<std::string> out = t->Render(*inputs);
  if (out.ok()) CHECK(out->size() <= (size_t{16} << 20));
  return 0;
}
