#include "common/chat/chat_template.h"

#include "common/base/status.h"

namespace mer {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool IsWhitespace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagSuffix(std::string_view text, std::string_view tag) {
  for (size_t k = std::min(tag.size() - 1, text.size()); k > 0; --k) {
    if (text.substr(text.size() - k) == tag.substr(0, k)) return k;
  }
  return 0;
}

}  // namespace

jinja::Value JsonToValue(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return jinja::Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return jinja::Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return jinja::Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return json.get<uint64_t>() <= uint64_t{INT64_MAX} ? jinja::Value(static_cast<int64_t>(json.get<uint64_t>()))
                                                         : jinja::Value(json.get<double>());
    case nlohmann::ordered_json::value_t::number_float:
      return jinja::Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return jinja::Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      jinja::Value::Array items;
      for (const auto& item : json) items.push_back(JsonToValue(item));
      return jinja::Value::MakeArray(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      jinja::Value::Object members;
      for (const auto& [k, v] : json.items()) members.emplace_back(k, JsonToValue(v));
      return jinja::Value::MakeObject(std::move(members));
    }
    default:
      return jinja::Value();
  }
}

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(source));
  return ChatTemplate(std::move(t), source.find(kThinkClose) != std::string_view::npos);
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& in) const {
  jinja::Value context = jinja::Value::MakeObject();
  for (const auto& [k, v] : in.extra.items()) context.Set(k, JsonToValue(v));
  context.Set("messages", JsonToValue(in.messages));
  context.Set("tools", JsonToValue(in.tools));  // None without tools, as transformers passes it
  context.Set("documents", jinja::Value::None());
  context.Set("add_generation_prompt", jinja::Value(in.add_generation_prompt));
  if (in.enable_thinking.has_value()) context.Set("enable_thinking", jinja::Value(*in.enable_thinking));
  context.Set("bos_token", jinja::Value(in.bos_token));
  context.Set("eos_token", jinja::Value(in.eos_token));
  return template_.Render(context);
}

bool PromptOpensReasoning(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkOpen);
  return open != std::string_view::npos && prompt.find(kThinkClose, open) == std::string_view::npos;
}

ReasoningStream::ReasoningStream(bool starts_in_reasoning)
    : state_(starts_in_reasoning ? State::kReasoning : State::kStart) {}

ReasoningStream::Delta ReasoningStream::Append(std::string_view text) {
  held_.append(text);
  return Run(false);
}

ReasoningStream::Delta ReasoningStream::Finish() { return Run(true); }

ReasoningStream::Delta ReasoningStream::Run(bool final) {
  Delta d;
  for (;;) {
    if (state_ == State::kStart) {
      // Leading whitespace, then "<think>" or not.
      size_t i = 0;
      while (i < held_.size() && IsWhitespace(held_[i])) ++i;
      const std::string_view rest = std::string_view(held_).substr(i);
      if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
        held_.erase(0, i + kThinkOpen.size());
        state_ = State::kReasoning;
        continue;
      }
      if (!final && kThinkOpen.substr(0, rest.size()) == rest) return d;  // undecided
      state_ = State::kContent;
      continue;
    }
    if (state_ == State::kReasoning) {
      if (!reasoning_started_) {
        size_t i = 0;
        while (i < held_.size() && IsWhitespace(held_[i])) ++i;
        held_.erase(0, i);
        if (held_.empty()) return d;
      }
      const size_t close = held_.find(kThinkClose);
      if (close != std::string::npos) {
        size_t end = close;
        while (end > 0 && IsWhitespace(held_[end - 1])) --end;
        d.reasoning += held_.substr(0, end);
        held_.erase(0, close + kThinkClose.size());
        state_ = State::kContent;
        continue;
      }
      // Release up to what may be the start of "</think>" or whitespace before it.
      size_t keep = final ? 0 : PartialTagSuffix(held_, kThinkClose);
      size_t end = held_.size() - keep;
      if (!final) {
        while (end > 0 && IsWhitespace(held_[end - 1])) --end;
      } else {
        while (end > 0 && IsWhitespace(held_[end - 1])) --end;
        held_.resize(end);
      }
      if (end > 0) reasoning_started_ = true;
      d.reasoning += held_.substr(0, end);
      held_.erase(0, end);
      if (final) held_.clear();
      return d;
    }
    // Content: everything, less the whitespace that starts it.
    if (!content_started_) {
      size_t i = 0;
      while (i < held_.size() && IsWhitespace(held_[i])) ++i;
      held_.erase(0, i);
      if (held_.empty()) return d;
      content_started_ = true;
    }
    d.content += held_;
    held_.clear();
    return d;
  }
}

std::string_view Qwen3ChatTemplate() {
  // The chat_template of Qwen3's tokenizer_config.json (the Qwen3 and Qwen3-MoE models, e.g.
  // Qwen/Qwen3-8B and Qwen/Qwen3-30B-A3B; the revision that checks `content is string`).
  static constexpr std::string_view kTemplate = R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %})TPL";
  return kTemplate;
}

}  // namespace mer
