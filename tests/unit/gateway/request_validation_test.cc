#include "services/gateway/request_validation.h"

#include <gtest/gtest.h>

namespace mer::gateway {
namespace {

class RequestValidationTest : public ::testing::Test {
 protected:
  RequestValidationTest() : tokenizer_(*Tokenizer::Create(MakeSyntheticVocab(300, 40))) {}

  mer::v1::GenerateRequest Good() const {
    mer::v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(1);
    r.mutable_token_ids()->add_ids(2);
    r.set_max_new_tokens(8);
    return r;
  }
  // The status of `r`, which must be InvalidArgument whose message starts with `field`.
  void ExpectBad(const mer::v1::GenerateRequest& r, const std::string& field) {
    const absl::Status s = ValidateGenerateRequest(r, tokenizer_, limits_).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_EQ(s.message().substr(0, field.size() + 1), field + ":") << s;
  }

  Tokenizer tokenizer_;
  ModelLimits limits_{300, 64, 1000};
};

TEST_F(RequestValidationTest, GoodRequests) {
  auto v = ValidateGenerateRequest(Good(), tokenizer_, limits_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->compute.prompt_size(), 2);
  EXPECT_EQ(v->kv_tokens, 2 + 8 - 1);
  // Every end-of-generation token of the vocabulary stops: <|endoftext|> (eos) and <|im_end|>.
  const int32_t im_end = tokenizer_.TokenId("<|im_end|>");
  EXPECT_EQ(std::vector<int32_t>(v->compute.stop_token_ids().begin(), v->compute.stop_token_ids().end()),
            (std::vector<int32_t>{tokenizer_.eos_id(), im_end}));
  EXPECT_FLOAT_EQ(v->compute.sampling().top_p(), 1.0f);
  EXPECT_FLOAT_EQ(v->compute.sampling().repetition_penalty(), 1.0f);
  mer::v1::GenerateRequest r = Good();
  r.set_text("hello world");
  r.set_ignore_eos(true);
  r.add_stop("\n");
  r.set_top_p(0.5f);
  r.set_temperature(0.7f);
  r.add_stop_token_ids(7);
  r.set_min_p(0.1f);
  r.set_presence_penalty(-2);
  r.set_frequency_penalty(2);
  (*r.mutable_logit_bias())[9] = -100;
  r.set_logprobs(true);
  r.set_top_logprobs(20);
  v = ValidateGenerateRequest(r, tokenizer_, limits_);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(std::vector<int32_t>(v->compute.prompt().begin(), v->compute.prompt().end()),
            tokenizer_.Encode("hello world"));
  // ignore_eos: only the request's own stop ids.
  EXPECT_EQ(std::vector<int32_t>(v->compute.stop_token_ids().begin(), v->compute.stop_token_ids().end()),
            std::vector<int32_t>{7});
  EXPECT_FLOAT_EQ(v->compute.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(v->compute.sampling().presence_penalty(), -2);
  EXPECT_FLOAT_EQ(v->compute.sampling().frequency_penalty(), 2);
  EXPECT_FLOAT_EQ(v->compute.sampling().logit_bias().at(9), -100);
  EXPECT_TRUE(v->compute.logprobs());
  EXPECT_EQ(v->compute.top_logprobs(), 20);
  EXPECT_EQ(v->stops, std::vector<std::string>{"\n"});
  // Exactly filling the context is allowed: the last token needs no position.
  r = Good();
  r.set_max_new_tokens(64 - 2 + 1);
  EXPECT_TRUE(ValidateGenerateRequest(r, tokenizer_, limits_).ok());
}

TEST_F(RequestValidationTest, EachBadFieldIsNamed) {
  mer::v1::GenerateRequest r = Good();
  r.clear_prompt();
  ExpectBad(r, "prompt");
  r.set_text("");
  ExpectBad(r, "prompt.text");
  r = Good();
  r.mutable_token_ids()->clear_ids();
  ExpectBad(r, "prompt.token_ids");
  r = Good();
  r.mutable_token_ids()->add_ids(300);
  ExpectBad(r, "prompt.token_ids[2]");
  r.mutable_token_ids()->set_ids(2, -1);
  ExpectBad(r, "prompt.token_ids[2]");
  r = Good();
  r.set_max_new_tokens(0);
  ExpectBad(r, "max_new_tokens");
  r.set_max_new_tokens(-5);
  ExpectBad(r, "max_new_tokens");
  r.set_max_new_tokens(64);  // 2 + 64 - 1 > 64
  ExpectBad(r, "max_new_tokens");
  r = Good();
  for (int i = 0; i < 70; ++i) r.mutable_token_ids()->add_ids(5);
  ExpectBad(r, "prompt");  // longer than the context
  r = Good();
  r.set_temperature(-0.1f);
  ExpectBad(r, "temperature");
  r.set_temperature(std::numeric_limits<float>::quiet_NaN());
  ExpectBad(r, "temperature");
  r = Good();
  r.set_top_p(0);
  ExpectBad(r, "top_p");
  r.set_top_p(1.5f);
  ExpectBad(r, "top_p");
  r = Good();
  r.set_top_k(-1);
  ExpectBad(r, "top_k");
  r = Good();
  r.set_repetition_penalty(0);
  ExpectBad(r, "repetition_penalty");
  r = Good();
  r.set_priority(101);
  ExpectBad(r, "priority");
  r = Good();
  r.add_stop("ok");
  r.add_stop("");
  ExpectBad(r, "stop[1]");
  r.set_stop(1, std::string(300, 'x'));
  ExpectBad(r, "stop[1]");
  r = Good();
  for (int i = 0; i < 17; ++i) r.add_stop("s");
  ExpectBad(r, "stop");
  r = Good();
  r.set_min_p(1.5f);
  ExpectBad(r, "min_p");
  r = Good();
  r.set_presence_penalty(2.5f);
  ExpectBad(r, "presence_penalty");
  r = Good();
  r.set_frequency_penalty(-3);
  ExpectBad(r, "frequency_penalty");
  r = Good();
  (*r.mutable_logit_bias())[300] = 1;
  ExpectBad(r, "logit_bias[300]");
  r = Good();
  (*r.mutable_logit_bias())[3] = 101;
  ExpectBad(r, "logit_bias[3]");
  r = Good();
  r.add_stop_token_ids(1);
  r.add_stop_token_ids(-1);
  ExpectBad(r, "stop_token_ids[1]");
  r = Good();
  r.set_logprobs(true);
  r.set_top_logprobs(21);
  ExpectBad(r, "top_logprobs");
  r.set_logprobs(false);
  r.set_top_logprobs(2);
  ExpectBad(r, "top_logprobs");
  limits_.kv_budget_tokens = 5;
  ExpectBad(Good(), "max_new_tokens");
}

// A length-delimited field of a serialized message: tag, length (< 128 here), bytes.
std::string Field(int number, const std::string& bytes) {
  return std::string(1, static_cast<char>(number << 3 | 2)) + static_cast<char>(bytes.size()) + bytes;
}

TEST_F(RequestValidationTest, TheWireIsCheckedBeforeItIsParsed) {
  mer::v1::GenerateRequest r = Good();
  r.clear_prompt();
  r.add_stop("ok");
  const std::string rest = r.SerializeAsString();  // max_new_tokens and a stop sequence
  const auto bad = [](const absl::StatusOr<mer::v1::GenerateRequest>& v, absl::string_view message) {
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << v.status();
    EXPECT_EQ(v.status().message(), message);
  };
  // Not UTF-8: the protobuf parser would refuse it as an internal error; here it is the field.
  bad(ParseGenerateRequest(Field(1, "ok \xff") + rest), "prompt.text: not valid UTF-8 at byte 3 of 4");
  bad(ParseGenerateRequest(Field(1, "\xe4\xbd") + rest), "prompt.text: not valid UTF-8 at byte 0 of 2");
  bad(ParseGenerateRequest(rest + Field(8, "\xc0\xaf")), "stop[1]: not valid UTF-8 at byte 0 of 2");
  // Both prompts: on the wire the later one would win silently.
  mer::v1::GenerateRequest ids;
  ids.mutable_token_ids()->add_ids(7);
  bad(ParseGenerateRequest(Field(1, "hi") + ids.SerializeAsString() + rest),
      "prompt: both text and token_ids are set; set one of them");
  bad(ParseGenerateRequest(ids.SerializeAsString() + Field(1, "hi")),
      "prompt: both text and token_ids are set; set one of them");
  bad(ParseGenerateRequest(std::string("\x0a\x7f", 2)), "request: 2 bytes that are not a mer.v1.GenerateRequest");
  // A good one parses as itself.
  auto ok = ParseGenerateRequest(Field(1, "h\xc3\xa9llo") + rest);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->text(), "h\xc3\xa9llo");
  EXPECT_EQ(ok->max_new_tokens(), 8);
  EXPECT_EQ(ok->stop(0), "ok");
  auto t = ParseTokenizeRequest(Field(1, "\xff"));
  EXPECT_EQ(t.status().message(), "text: not valid UTF-8 at byte 0 of 1");
}

TEST_F(RequestValidationTest, ATextThatCannotFitTheContextIsRefusedBeforeTokenizing) {
  mer::v1::GenerateRequest r = Good();
  limits_.max_token_bytes = 4;  // 64 positions x 4 bytes: 256 bytes at most
  r.set_text(std::string(256, 'a'));
  r.set_max_new_tokens(1);
  const absl::Status fits = ValidateGenerateRequest(r, tokenizer_, limits_).status();
  EXPECT_NE(fits.message().find("the text"), 0u) << fits;  // tokenized: a real count, if any
  r.set_text(std::string(257, 'a'));
  const absl::Status s = ValidateGenerateRequest(r, tokenizer_, limits_).status();
  EXPECT_EQ(s.message(), "prompt: the text (257 bytes) is at least 65 tokens; the context holds 64") << s;
  RequestLimits small;
  small.max_prompt_bytes = 100;
  r.set_text(std::string(101, 'a'));
  EXPECT_EQ(ValidateGenerateRequest(r, tokenizer_, limits_, small).status().message(),
            "prompt.text: 101 bytes; at most 100");
  EXPECT_GE(MaxTokenBytes(tokenizer_), 2);
}

}  // namespace
}  // namespace mer::gateway
