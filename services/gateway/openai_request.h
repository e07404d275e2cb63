// The OpenAI-compatible API's requests (docs/api.md, "HTTP API"): the JSON bodies of
// /v1/completions and /v1/chat/completions parsed and checked into what the generation path
// takes (mer.v1.GenerateRequest) plus what only the HTTP front uses (stream, n, chat messages),
// and errors in OpenAI's JSON shape with their HTTP status. Parsing needs no model: what depends
// on it (the prompt's tokens, the context, the vocabulary) is checked afterwards by
// request_validation.h, on the same path as gRPC's requests.
//
// Every rejection is InvalidArgument whose message starts with the parameter's name
// ("max_tokens: must be an integer >= 1"), as the gRPC API's messages do.
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "mer/v1/mer.pb.h"
#include "nlohmann/json.hpp"

namespace mer::gateway::openai {

using Json = nlohmann::ordered_json;

enum class Endpoint { kCompletions, kChatCompletions };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // empty: the served one
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;                   // choices per prompt
  // Completions: the prompts, each a text or token ids (one choice group per prompt).
  std::vector<mer::v1::GenerateRequest> prompts;
  // Chat: the conversation and what the chat template sees besides it.
  Json messages;
  Json tools;  // null: none
  // Whether the reply's <tool_call> blocks come back as `tool_calls` (tools given, tool_choice
  // not "none"; common/chat/tool_calls.h).
  bool parse_tool_calls = false;
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;  // chat_template_kwargs.enable_thinking or top level
  Json chat_template_kwargs = Json::object();
  // Sampling, stops, logprobs and max_tokens for every prompt (prompt fields unset).
  mer::v1::GenerateRequest options;
  bool max_tokens_given = false;
  bool seed_given = false;
  bool logprobs = false;  // chat: logprobs: true; completions: logprobs: N
};

struct Limits {
  int max_n = 16;           // choices of one request
  int max_prompts = 64;     // prompts of one completions request
  int max_messages = 4096;  // messages of one chat request
};

absl::StatusOr<ParsedRequest> ParseRequest(Endpoint endpoint, std::string_view body, const Limits& limits = {});

// An error response: the HTTP status and the body {"error": {"message", "type", "param", "code"}}.
struct HttpError {
  int status = 500;
  std::string body;
};
// From the status of a call (InvalidArgument 400, NotFound 404, ResourceExhausted 429,
// Unavailable 503, DeadlineExceeded 504, ...). `param` is the parameter an InvalidArgument names.
HttpError ErrorFromStatus(const absl::Status& status);
// The body alone, for errors found outside a call (413: the body is too large; 405, 404 route).
std::string ErrorBody(std::string_view message, std::string_view type, std::string_view code);

}  // namespace mer::gateway::openai
