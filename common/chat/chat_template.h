// Chat prompts from a model's chat template (the GGUF's tokenizer.chat_template, Jinja), and the
// split of a reply into its reasoning (Qwen3's <think>...</think>) and its content, as the
// OpenAI-compatible servers of vLLM and llama.cpp return them (`reasoning_content` apart from
// `content`).
//
// Thread-safety: ChatTemplate is immutable (Render may run concurrently); a ReasoningStream
// belongs to one reply.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/chat/jinja.h"
#include "nlohmann/json.hpp"

namespace mer {

// What a chat template sees besides the messages. Hugging Face's apply_chat_template passes the
// same variables.
struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, ...}]
  nlohmann::ordered_json tools;                                       // null: none
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // Qwen3: false closes an empty <think> block in the prompt
  std::string bos_token;
  std::string eos_token;
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables (chat_template_kwargs)
};

class ChatTemplate {
 public:
  // InvalidArgument when the template does not parse (jinja.h says what is supported).
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // The prompt. InvalidArgument when rendering fails (raise_exception, a type error, ...).
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

  // Whether replies may carry reasoning: the template knows Qwen3's <think> block.
  bool has_reasoning() const { return has_reasoning_; }

 private:
  ChatTemplate(jinja::Template t, bool has_reasoning) : template_(std::move(t)), has_reasoning_(has_reasoning) {}
  jinja::Template template_;
  bool has_reasoning_;
};

// JSON as a template value (objects keep their order; integers stay integers).
jinja::Value JsonToValue(const nlohmann::ordered_json& json);

// Splits streamed reply text into reasoning and content: text between a leading "<think>" (or
// the start, when the prompt itself opened the block) and "</think>" is reasoning, the rest
// content. Whitespace around the reasoning and at the start of the content is dropped, as
// llama-server does. Text that may be the start of a tag is held until it is decided, so every
// delta is final.
class ReasoningStream {
 public:
  // starts_in_reasoning: the prompt ends inside an open <think> block.
  explicit ReasoningStream(bool starts_in_reasoning = false);

  struct Delta {
    std::string reasoning;
    std::string content;
  };
  Delta Append(std::string_view text);
  Delta Finish();  // the held text, as what it turned out to be

 private:
  enum class State { kStart, kReasoning, kContent };
  Delta Run(bool final);

  State state_;
  std::string held_;
  bool content_started_ = false;  // leading whitespace of the content is dropped until then
  bool reasoning_started_ = false;
};

// Whether the rendered prompt leaves a <think> block open (the reply starts in reasoning).
bool PromptOpensReasoning(std::string_view prompt);

// The Qwen3 chat template (Qwen3 and Qwen3-MoE, e.g. Qwen/Qwen3-30B-A3B's tokenizer_config.json),
// for `mer synth --chat-template qwen3` and the tests.
std::string_view Qwen3ChatTemplate();

}  // namespace mer
