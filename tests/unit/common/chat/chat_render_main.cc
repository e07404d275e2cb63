// chat_render: reference_render.py's interface over mer's renderer (common/chat), for
// chat_template_reference_test. stdin: a JSON list of cases {template, messages, tools?,
// add_generation_prompt?, enable_thinking?, bos_token?, eos_token?}; stdout: a JSON list of
// {"ok": true, "text": RENDER} or {"ok": false, "error": MESSAGE}.
#include <iostream>
#include <iterator>
#include <string>

#include "common/chat/chat_template.h"

int main() {
  const std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  const nlohmann::ordered_json cases = nlohmann::ordered_json::parse(input);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& c : cases) {
    mer::ChatTemplateInputs in;
    in.messages = c.at("messages");
    if (c.contains("tools")) in.tools = c["tools"];
    in.add_generation_prompt = c.value("add_generation_prompt", true);
    if (c.contains("enable_thinking")) in.enable_thinking = c["enable_thinking"].get<bool>();
    in.bos_token = c.value("bos_token", "");
    in.eos_token = c.value("eos_token", "");
    const absl::StatusOr<mer::ChatTemplate> t = mer::ChatTemplate::Parse(c.at("template").get<std::string>());
    const absl::StatusOr<std::string> text = t.ok() ? t->Render(in) : absl::StatusOr<std::string>(t.status());
    if (text.ok())
      out.push_back({{"ok", true}, {"text", *text}});
    else
      out.push_back({{"ok", false}, {"error", std::string(text.status().message())}});
  }
  std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  return 0;
}
