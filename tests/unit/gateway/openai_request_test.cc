#include "services/gateway/openai_request.h"

#include <gtest/gtest.h>

namespace mer::gateway::openai {
namespace {

// The parameter a rejection names: the start of its message, and OpenAI's `param`.
void ExpectBad(Endpoint e, const std::string& body, const std::string& param) {
  const absl::Status s = ParseRequest(e, body).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << body << ": " << s;
  EXPECT_EQ(std::string(s.message()).substr(0, param.size() + 1), param + ":") << s;
  const HttpError err = ErrorFromStatus(s);
  EXPECT_EQ(err.status, 400);
  const Json j = Json::parse(err.body);
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], param) << err.body;
}

TEST(OpenAiRequestTest, Completions) {
  auto r = ParseRequest(Endpoint::kCompletions,
                        R"({"model": "m", "prompt": "hi", "temperature": 0.5, "top_p": 0.9, "top_k": -1,
                            "min_p": 0.1, "seed": 3, "stop": "\n", "n": 2, "stream": true,
                            "stream_options": {"include_usage": true}, "logprobs": 3, "ignore_eos": true,
                            "logit_bias": {"7": -100}, "stop_token_ids": [5], "unknown": {"x": 1}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_TRUE(r->stream && r->include_usage && r->logprobs && r->seed_given && !r->max_tokens_given);
  EXPECT_EQ(r->n, 2);
  ASSERT_EQ(r->prompts.size(), 1u);
  EXPECT_EQ(r->prompts[0].text(), "hi");
  const mer::v1::GenerateRequest& g = r->options;
  EXPECT_EQ(g.max_new_tokens(), 16);  // OpenAI's default for completions
  EXPECT_FLOAT_EQ(g.temperature(), 0.5f);
  EXPECT_EQ(g.top_k(), 0);
  EXPECT_FLOAT_EQ(g.min_p(), 0.1f);
  EXPECT_EQ(g.seed(), 3u);
  EXPECT_EQ(g.stop_size(), 1);
  EXPECT_EQ(g.top_logprobs(), 3);
  EXPECT_TRUE(g.ignore_eos());
  EXPECT_FLOAT_EQ(g.logit_bias().at(7), -100.0f);
  EXPECT_EQ(g.stop_token_ids(0), 5);
  // Token ids, and a batch of prompts.
  r = ParseRequest(Endpoint::kCompletions, R"({"prompt": [1, 2, 3], "max_tokens": 4})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts[0].token_ids().ids_size(), 3);
  EXPECT_FLOAT_EQ(r->options.temperature(), 1.0f);  // OpenAI's default
  r = ParseRequest(Endpoint::kCompletions, R"({"prompt": ["a", [4, 5]]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompts.size(), 2u);
}

TEST(OpenAiRequestTest, Chat) {
  auto r = ParseRequest(Endpoint::kChatCompletions,
                        R"({"messages": [{"role": "developer", "content": "be brief"},
                                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]},
                                         {"role": "assistant", "tool_calls": []}],
                            "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 2,
                            "chat_template_kwargs": {"enable_thinking": false, "x": 1}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->messages[0]["role"], "system");
  EXPECT_EQ(r->messages[1]["content"], "a\nb");
  EXPECT_TRUE(r->messages[2]["content"].is_null());
  EXPECT_EQ(r->options.max_new_tokens(), 9);
  EXPECT_TRUE(r->max_tokens_given);
  EXPECT_EQ(r->options.top_logprobs(), 2);
  EXPECT_EQ(r->enable_thinking, false);
  EXPECT_EQ(r->chat_template_kwargs["x"], 1);
  r = ParseRequest(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->max_tokens_given);  // the HTTP front fills the context
}

TEST(OpenAiRequestTest, ToolCallsAreParsedWhenToolsAreOfferedAndNotRefused) {
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  struct Case {
    std::string extra;
    bool parse;
  };
  for (const Case& c :
       {Case{"", false}, Case{", " + tools, true}, Case{", " + tools + R"(, "tool_choice": "auto")", true},
        Case{", " + tools + R"(, "tool_choice": "required")", true},
        Case{", " + tools + R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})", true},
        Case{", " + tools + R"(, "tool_choice": "none")", false}, Case{R"(, "tools": [])", false}}) {
    auto r = ParseRequest(Endpoint::kChatCompletions, "{" + user + c.extra + "}");
    ASSERT_TRUE(r.ok()) << c.extra << ": " << r.status();
    EXPECT_EQ(r->parse_tool_calls, c.parse) << c.extra;
  }
  for (const char* bad : {R"("tool_choice": "sometimes")", R"("tool_choice": 3)"}) {
    auto r = ParseRequest(Endpoint::kChatCompletions, "{" + user + ", " + tools + ", " + bad + "}");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("tool_choice"), std::string::npos);
  }
}

TEST(OpenAiRequestTest, BadRequestsNameTheParameter) {
  const Endpoint c = Endpoint::kCompletions, chat = Endpoint::kChatCompletions;
  EXPECT_EQ(ParseRequest(c, "{").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseRequest(c, "[1]").status().code(), absl::StatusCode::kInvalidArgument);
  ExpectBad(c, R"({})", "prompt");
  ExpectBad(c, R"({"prompt": 5})", "prompt");
  ExpectBad(c, R"({"prompt": ["a", 5]})", "prompt[1]");
  ExpectBad(c, R"({"prompt": [1, "x"]})", "prompt[1]");
  ExpectBad(c, R"({"prompt": "a", "max_tokens": "ten"})", "max_tokens");
  ExpectBad(c, R"({"prompt": "a", "max_tokens": 0})", "max_tokens");
  ExpectBad(c, R"({"prompt": "a", "max_tokens": 18446744073709551615})", "max_tokens");
  ExpectBad(c, R"({"prompt": "a", "temperature": 3})", "temperature");
  ExpectBad(c, R"({"prompt": "a", "top_p": 0})", "top_p");
  ExpectBad(c, R"({"prompt": "a", "n": 17})", "n");
  ExpectBad(c, R"({"prompt": "a", "stream": "yes"})", "stream");
  ExpectBad(c, R"({"prompt": "a", "stop": [1]})", "stop[0]");
  ExpectBad(c, R"({"prompt": "a", "logit_bias": {"x": 1}})", "logit_bias[x]");
  ExpectBad(c, R"({"prompt": "a", "logprobs": 21})", "logprobs");
  ExpectBad(c, R"({"prompt": "a", "model": 3})", "model");
  ExpectBad(chat, R"({"messages": []})", "messages");
  ExpectBad(chat, R"({"messages": [{"role": "user"}]})", "messages[0].content");
  ExpectBad(chat, R"({"messages": [{"role": "bot", "content": "x"}]})", "messages[0].role");
  ExpectBad(chat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
            "messages[0].content[0].type");
  ExpectBad(chat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs");
  ExpectBad(chat, R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})",
            "chat_template_kwargs");
  // Output constraints are refused, not ignored; response_format text (the default) is served.
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  ExpectBad(chat, "{" + user + R"(, "response_format": {"type": "json_object"}})", "response_format");
  ExpectBad(chat, "{" + user + R"(, "response_format": {"type": "json_schema", "json_schema": {}}})",
            "response_format");
  ExpectBad(chat, "{" + user + R"(, "response_format": {}})", "response_format.type");
  ExpectBad(chat, "{" + user + R"(, "response_format": "json"})", "response_format");
  ExpectBad(chat, "{" + user + R"(, "guided_json": {"type": "object"}})", "guided_json");
  ExpectBad(c, R"({"prompt": "a", "grammar": "root ::= \"x\""})", "grammar");
  ExpectBad(c, R"({"prompt": "a", "json_schema": {}})", "json_schema");
  EXPECT_TRUE(ParseRequest(chat, "{" + user + R"(, "response_format": {"type": "text"}})").ok());
  EXPECT_TRUE(ParseRequest(chat, "{" + user + R"(, "response_format": null, "guided_json": null})").ok());
}

TEST(OpenAiRequestTest, StatusCodes) {
  EXPECT_EQ(ErrorFromStatus(absl::NotFoundError("The model `x` does not exist")).status, 404);
  EXPECT_EQ(Json::parse(ErrorFromStatus(absl::NotFoundError("m")).body)["error"]["code"], "model_not_found");
  EXPECT_EQ(ErrorFromStatus(absl::ResourceExhaustedError("the queue is full")).status, 429);
  EXPECT_EQ(ErrorFromStatus(absl::UnavailableError("down")).status, 503);
  EXPECT_EQ(ErrorFromStatus(absl::DeadlineExceededError("late")).status, 504);
  EXPECT_EQ(ErrorFromStatus(absl::InternalError("x")).status, 500);
  EXPECT_EQ(Json::parse(ErrorBody("too large", "invalid_request_error", ""))["error"]["message"], "too large");
}

}  // namespace
}  // namespace mer::gateway::openai
