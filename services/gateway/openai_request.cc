#include "services/gateway/openai_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer::gateway::openai {
namespace {

absl::Status Bad(std::string_view param, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(param), ": ", std::string(what)));
}

const char* TypeName(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a value of another type";
  }
}

// A field that may be absent or null (both mean: the default).
const Json* Get(const Json& body, const char* key) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// Output constraints (OpenAI's response_format other than text, vLLM's guided_* fields,
// llama-server's grammar and json_schema) are refused rather than ignored: a reply generated
// without them would read as one in the asked-for format and not be one.
absl::Status RefuseOutputConstraints(const Json& body) {
  if (const Json* format = Get(body, "response_format")) {
    if (!format->is_object()) return Bad("response_format", "must be an object");
    const Json* type = Get(*format, "type");
    if (type == nullptr || !type->is_string()) return Bad("response_format.type", "must be a string");
    if (type->get<std::string>() != "text")
      return Bad("response_format",
                 absl::StrCat("type \"", type->get<std::string>(),
                              "\" is not supported: this server does not constrain its output (only \"text\")"));
  }
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
                          "grammar", "json_schema"}) {
    if (Get(body, key) != nullptr) return Bad(key, "is not supported: this server does not constrain its output");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<double>> Number(const Json& body, const char* key, double lo, double hi) {
  const Json* v = Get(body, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return Bad(key, absl::StrCat("must be a number, got ", TypeName(*v)));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
  return std::optional<double>(x);
}

absl::StatusOr<std::optional<int64_t>> Integer(const Json& body, const char* key, int64_t lo, int64_t hi) {
  const Json* v = Get(body, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) return Bad(key, absl::StrCat("must be an integer, got ", TypeName(*v)));
  // Out-of-range unsigned values read back as negative: reject them before the range check lies.
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX})
    return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "]"));
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) return Bad(key, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
  return std::optional<int64_t>(x);
}

absl::StatusOr<bool> Bool(const Json& body, const char* key, bool dflt) {
  const Json* v = Get(body, key);
  if (v == nullptr) return dflt;
  if (!v->is_boolean()) return Bad(key, absl::StrCat("must be a boolean, got ", TypeName(*v)));
  return v->get<bool>();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const Json& v, const std::string& param) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& x = v[i];
    if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() > uint64_t{INT32_MAX}) ||
        x.get<int64_t>() < INT32_MIN || x.get<int64_t>() > INT32_MAX)
      return Bad(absl::StrCat(param, "[", i, "]"), "must be a token id (an integer)");
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return ids;
}

absl::Status ParsePrompts(const Json& body, const Limits& limits, ParsedRequest* r) {
  const Json* p = Get(body, "prompt");
  if (p == nullptr) return Bad("prompt", "missing");
  auto add_text = [&](const std::string& text) {
    mer::v1::GenerateRequest g;
    g.set_text(text);
    r->prompts.push_back(std::move(g));
  };
  auto add_ids = [&](std::vector<int32_t> ids) {
    mer::v1::GenerateRequest g;
    g.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    r->prompts.push_back(std::move(g));
  };
  if (p->is_string()) {
    add_text(p->get<std::string>());
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIds(*p, "prompt"));
    add_ids(std::move(ids));
  } else if (p->is_array() && !p->empty()) {
    if (p->size() > static_cast<size_t>(limits.max_prompts))
      return Bad("prompt", absl::StrCat(p->size(), " prompts; at most ", limits.max_prompts));
    for (size_t i = 0; i < p->size(); ++i) {
      const Json& x = (*p)[i];
      const std::string param = absl::StrCat("prompt[", i, "]");
      if (x.is_string()) {
        add_text(x.get<std::string>());
      } else if (x.is_array()) {
        ASSIGN_OR_RETURN(std::vector<int32_t> ids, TokenIds(x, param));
        add_ids(std::move(ids));
      } else {
        return Bad(param, "must be a string or an array of token ids");
      }
    }
  } else {
    return Bad("prompt", "must be a string, an array of strings, or an array of token ids (non-empty)");
  }
  return absl::OkStatus();
}

// Chat content: a string, null, or text parts [{"type": "text", "text": ...}] (joined with "\n",
// as vLLM does for templates that take strings).
absl::StatusOr<Json> Content(const Json& content, const std::string& param) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array())
    return Bad(param, absl::StrCat("must be a string or an array of parts, got ", TypeName(content)));
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& part = content[i];
    const std::string pp = absl::StrCat(param, "[", i, "]");
    if (!part.is_object()) return Bad(pp, "must be an object");
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) return Bad(absl::StrCat(pp, ".type"), "missing");
    if (*type != "text")
      return Bad(absl::StrCat(pp, ".type"),
                 absl::StrCat("'", type->get<std::string>(), "' is not supported (only text)"));
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string()) return Bad(absl::StrCat(pp, ".text"), "must be a string");
    if (i > 0) text += "\n";
    text += t->get<std::string>();
  }
  return Json(text);
}

absl::Status ParseMessages(const Json& body, const Limits& limits, ParsedRequest* r) {
  const Json* m = Get(body, "messages");
  if (m == nullptr) return Bad("messages", "missing");
  if (!m->is_array() || m->empty()) return Bad("messages", "must be a non-empty array");
  if (m->size() > static_cast<size_t>(limits.max_messages))
    return Bad("messages", absl::StrCat(m->size(), " messages; at most ", limits.max_messages));
  r->messages = Json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& msg = (*m)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!msg.is_object()) return Bad(param, "must be an object");
    const auto role = msg.find("role");
    if (role == msg.end() || !role->is_string()) return Bad(absl::StrCat(param, ".role"), "must be a string");
    const std::string rs = role->get<std::string>();
    if (rs != "system" && rs != "developer" && rs != "user" && rs != "assistant" && rs != "tool")
      return Bad(absl::StrCat(param, ".role"),
                 absl::StrCat("'", rs, "' is not one of system, developer, user, assistant, tool"));
    Json out = msg;
    if (rs == "developer") out["role"] = "system";  // OpenAI's newer name for the system role
    const auto content = msg.find("content");
    if (content == msg.end()) {
      if (rs != "assistant") return Bad(absl::StrCat(param, ".content"), "missing");
      out["content"] = nullptr;
    } else {
      ASSIGN_OR_RETURN(out["content"], Content(*content, absl::StrCat(param, ".content")));
    }
    r->messages.push_back(std::move(out));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const Json& body, mer::v1::GenerateRequest* g) {
  const Json* s = Get(body, "stop");
  if (s == nullptr) return absl::OkStatus();
  if (s->is_string()) {
    g->add_stop(s->get<std::string>());
    return absl::OkStatus();
  }
  if (!s->is_array()) return Bad("stop", "must be a string or an array of strings");
  for (size_t i = 0; i < s->size(); ++i) {
    if (!(*s)[i].is_string()) return Bad(absl::StrCat("stop[", i, "]"), "must be a string");
    g->add_stop((*s)[i].get<std::string>());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body_text, const Limits& limits) {
  Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return absl::InvalidArgumentError("body: not valid JSON");
  if (!body.is_object()) return absl::InvalidArgumentError("body: must be a JSON object");
  ParsedRequest r;
  r.endpoint = endpoint;
  if (const Json* m = Get(body, "model")) {
    if (!m->is_string()) return Bad("model", absl::StrCat("must be a string, got ", TypeName(*m)));
    r.model = m->get<std::string>();
  }
  RETURN_IF_ERROR(RefuseOutputConstraints(body));
  ASSIGN_OR_RETURN(r.stream, Bool(body, "stream", false));
  if (const Json* so = Get(body, "stream_options")) {
    if (!so->is_object()) return Bad("stream_options", "must be an object");
    ASSIGN_OR_RETURN(r.include_usage, Bool(*so, "include_usage", false));
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> n, Integer(body, "n", 1, limits.max_n));
  r.n = static_cast<int>(n.value_or(1));

  mer::v1::GenerateRequest& g = r.options;
  // max_completion_tokens is the chat API's newer name; either is accepted.
  std::optional<int64_t> max_tokens;
  for (const char* key : {"max_completion_tokens", "max_tokens"}) {
    ASSIGN_OR_RETURN(std::optional<int64_t> v, Integer(body, key, 1, std::numeric_limits<int32_t>::max()));
    if (v.has_value() && !max_tokens.has_value()) max_tokens = v;
  }
  r.max_tokens_given = max_tokens.has_value();
  g.set_max_new_tokens(static_cast<int32_t>(max_tokens.value_or(endpoint == Endpoint::kCompletions ? 16 : 0)));
  ASSIGN_OR_RETURN(std::optional<double> temperature, Number(body, "temperature", 0, 2));
  g.set_temperature(static_cast<float>(temperature.value_or(1.0)));
  ASSIGN_OR_RETURN(std::optional<double> top_p, Number(body, "top_p", 0, 1));
  if (top_p && !(*top_p > 0)) return Bad("top_p", "must be in (0, 1], got 0");
  if (top_p) g.set_top_p(static_cast<float>(*top_p));
  ASSIGN_OR_RETURN(std::optional<int64_t> top_k, Integer(body, "top_k", -1, std::numeric_limits<int32_t>::max()));
  g.set_top_k(top_k.has_value() && *top_k > 0 ? static_cast<int32_t>(*top_k) : 0);  // -1 and 0: off (vLLM)
  ASSIGN_OR_RETURN(std::optional<double> min_p, Number(body, "min_p", 0, 1));
  if (min_p) g.set_min_p(static_cast<float>(*min_p));
  ASSIGN_OR_RETURN(std::optional<double> presence, Number(body, "presence_penalty", -2, 2));
  if (presence) g.set_presence_penalty(static_cast<float>(*presence));
  ASSIGN_OR_RETURN(std::optional<double> frequency, Number(body, "frequency_penalty", -2, 2));
  if (frequency) g.set_frequency_penalty(static_cast<float>(*frequency));
  ASSIGN_OR_RETURN(std::optional<double> repetition, Number(body, "repetition_penalty", 1e-6, 10));
  if (repetition) g.set_repetition_penalty(static_cast<float>(*repetition));
  ASSIGN_OR_RETURN(std::optional<int64_t> seed,
                   Integer(body, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  r.seed_given = seed.has_value();
  g.set_seed(static_cast<uint64_t>(seed.value_or(0)));
  ASSIGN_OR_RETURN(bool ignore_eos, Bool(body, "ignore_eos", false));
  g.set_ignore_eos(ignore_eos);
  RETURN_IF_ERROR(ParseStop(body, &g));
  if (const Json* ids = Get(body, "stop_token_ids")) {
    if (!ids->is_array()) return Bad("stop_token_ids", "must be an array of token ids");
    ASSIGN_OR_RETURN(std::vector<int32_t> v, TokenIds(*ids, "stop_token_ids"));
    g.mutable_stop_token_ids()->Add(v.begin(), v.end());
  }
  if (const Json* bias = Get(body, "logit_bias")) {
    if (!bias->is_object()) return Bad("logit_bias", "must be an object of token id -> bias");
    for (const auto& [key, value] : bias->items()) {
      int32_t id;
      const std::string param = absl::StrCat("logit_bias[", key, "]");
      if (!absl::SimpleAtoi(key, &id)) return Bad(param, "the key must be a token id");
      if (!value.is_number()) return Bad(param, "must be a number");
      (*g.mutable_logit_bias())[id] = static_cast<float>(value.get<double>());
    }
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> priority, Integer(body, "priority", -1000000, 1000000));
  g.set_priority(static_cast<int32_t>(priority.value_or(0)));

  if (endpoint == Endpoint::kCompletions) {
    // logprobs: N alternatives per token (0..5 in OpenAI's API; up to 20 here, as vLLM allows).
    ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, Integer(body, "logprobs", 0, 20));
    r.logprobs = logprobs.has_value();
    g.set_logprobs(r.logprobs);
    g.set_top_logprobs(static_cast<int32_t>(logprobs.value_or(0)));
    RETURN_IF_ERROR(ParsePrompts(body, limits, &r));
  } else {
    ASSIGN_OR_RETURN(r.logprobs, Bool(body, "logprobs", false));
    ASSIGN_OR_RETURN(std::optional<int64_t> top, Integer(body, "top_logprobs", 0, 20));
    if (top.has_value() && !r.logprobs) return Bad("top_logprobs", "needs logprobs: true");
    g.set_logprobs(r.logprobs);
    g.set_top_logprobs(static_cast<int32_t>(top.value_or(0)));
    RETURN_IF_ERROR(ParseMessages(body, limits, &r));
    if (const Json* tools = Get(body, "tools")) {
      if (!tools->is_array()) return Bad("tools", "must be an array");
      r.tools = *tools;
    }
    bool tool_choice_none = false;
    if (const Json* choice = Get(body, "tool_choice")) {
      // "none", "auto", "required", or {"type": "function", ...}: the template offers the tools
      // either way; "none" keeps the reply's text as it is.
      if (choice->is_string()) {
        const std::string c = choice->get<std::string>();
        if (c != "none" && c != "auto" && c != "required")
          return Bad("tool_choice", "must be \"none\", \"auto\", \"required\" or an object");
        tool_choice_none = c == "none";
      } else if (!choice->is_object()) {
        return Bad("tool_choice", "must be a string or an object");
      }
    }
    r.parse_tool_calls = r.tools.is_array() && !r.tools.empty() && !tool_choice_none;
    ASSIGN_OR_RETURN(r.add_generation_prompt, Bool(body, "add_generation_prompt", true));
    if (const Json* kw = Get(body, "chat_template_kwargs")) {
      if (!kw->is_object()) return Bad("chat_template_kwargs", "must be an object");
      r.chat_template_kwargs = *kw;
      if (const Json* t = Get(*kw, "enable_thinking")) {
        if (!t->is_boolean()) return Bad("chat_template_kwargs.enable_thinking", "must be a boolean");
        r.enable_thinking = t->get<bool>();
      }
    }
    if (const Json* t = Get(body, "enable_thinking")) {  // llama-server and SGLang accept it at the top level
      if (!t->is_boolean()) return Bad("enable_thinking", "must be a boolean");
      r.enable_thinking = t->get<bool>();
    }
  }
  return r;
}

std::string ErrorBody(std::string_view message, std::string_view type, std::string_view code) {
  Json e = {{"message", std::string(message)},
            {"type", std::string(type)},
            {"param", nullptr},
            {"code", code.empty() ? Json(nullptr) : Json(std::string(code))}};
  return Json{{"error", std::move(e)}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

HttpError ErrorFromStatus(const absl::Status& status) {
  HttpError e;
  std::string type = "server_error", code;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      e.status = 400;
      type = "invalid_request_error";
      break;
    case absl::StatusCode::kNotFound:
      e.status = 404;
      type = "invalid_request_error";
      code = "model_not_found";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.status = 429;
      type = "rate_limit_error";
      break;
    case absl::StatusCode::kUnavailable:
      e.status = 503;
      type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.status = 504;
      type = "timeout";
      break;
    case absl::StatusCode::kCancelled:
      e.status = 499;
      type = "cancelled";
      break;
    case absl::StatusCode::kFailedPrecondition:
      e.status = 400;
      type = "invalid_request_error";
      break;
    default:
      e.status = 500;
      break;
  }
  const std::string message(status.message());
  Json err = {
      {"message", message}, {"type", type}, {"param", nullptr}, {"code", code.empty() ? Json(nullptr) : Json(code)}};
  if (status.code() == absl::StatusCode::kInvalidArgument) {
    // The parameter is the message's first word ("max_tokens: ..."), as OpenAI's `param`.
    const size_t colon = message.find(": ");
    if (colon != std::string::npos && message.find(' ') >= colon) err["param"] = message.substr(0, colon);
  }
  e.body = Json{{"error", std::move(err)}}.dump(-1, ' ', false, Json::error_handler_t::replace);
  return e;
}

}  // namespace mer::gateway::openai
