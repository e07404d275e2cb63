#include "common/chat/tool_calls.h"

#include <nlohmann/json.hpp>

namespace mer {
namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagAtEnd(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

bool ParseToolCall(std::string_view body, ToolCall* out) {
  const nlohmann::json j = nlohmann::json::parse(body, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  out->name = name->get<std::string>();
  const auto args = j.find("arguments");
  if (args == j.end() || args->is_null()) {
    out->arguments = "{}";
  } else if (args->is_string()) {
    out->arguments = args->get<std::string>();  // already text (some models write it so)
  } else {
    out->arguments = args->dump();
  }
  return true;
}

ToolCallStream::Delta ToolCallStream::Append(std::string_view text) {
  held_.append(text);
  return Run(false);
}

ToolCallStream::Delta ToolCallStream::Finish() { return Run(true); }

ToolCallStream::Delta ToolCallStream::Run(bool final) {
  Delta d;
  for (;;) {
    if (!in_block_) {
      if (after_call_) {  // the whitespace between calls, or after the last, is not content
        size_t i = 0;
        while (i < held_.size() && IsSpace(held_[i])) ++i;
        held_.erase(0, i);
        if (held_.empty() && !final) return d;
        after_call_ = false;
      }
      const size_t open = held_.find(kOpen);
      if (open != std::string::npos) {
        size_t end = open;
        while (end > 0 && IsSpace(held_[end - 1])) --end;
        d.content += held_.substr(0, end);
        block_lead_ = held_.substr(end, open - end);  // text again if the block is no call
        held_.erase(0, open + kOpen.size());
        in_block_ = true;
        continue;
      }
      // Held: a possible start of the tag, and the whitespace before it (it goes if a call follows).
      size_t keep = 0;
      if (!final) {
        keep = PartialTagAtEnd(held_, kOpen);
        while (keep < held_.size() && IsSpace(held_[held_.size() - keep - 1])) ++keep;
      }
      d.content += held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return d;
    }
    const size_t close = held_.find(kClose);
    if (close == std::string::npos) {
      if (final) {  // never closed: the model's text, as written
        d.content += block_lead_ + std::string(kOpen) + held_;
        held_.clear();
        in_block_ = false;
      }
      return d;
    }
    ToolCall call;
    if (ParseToolCall(std::string_view(held_).substr(0, close), &call)) {
      d.calls.push_back(std::move(call));
      ++calls_;
      after_call_ = true;
    } else {
      d.content += block_lead_ + std::string(kOpen) + held_.substr(0, close + kClose.size());
    }
    held_.erase(0, close + kClose.size());
    in_block_ = false;
  }
}

}  // namespace mer
