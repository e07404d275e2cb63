// Checks a public GenerateRequest against the served model before it is queued, and turns it
// into the internal request. Every rejection is InvalidArgument with a message that starts with
// the offending field's name ("max_new_tokens: must be >= 1, got 0").
//
// Requests arrive as bytes (ParseGenerateRequest): the protobuf parser refuses a proto3 string
// that is not UTF-8 with an internal error and lets the later of two oneof members win silently,
// so both are checked on the wire first and reported as the bad field they are.
//
// Cost: a text prompt is tokenized only after every check that needs no tokens, and only when
// it could fit the context (a token covers at most max_token_bytes bytes of text, so a text of
// more than max_context_tokens x max_token_bytes bytes cannot), so a huge prompt is refused
// before the tokenizer's working set (several times the text) is allocated.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/tokenizer.h"
#include "mer/internal/v1/compute.pb.h"
#include "mer/v1/mer.pb.h"

namespace mer::gateway {

// What the served model allows (from mer-compute's GetInfo).
struct ModelLimits {
  int32_t vocab_size = 0;
  int32_t max_context_tokens = 0;  // positions per sequence
  int64_t kv_budget_tokens = 0;    // positions all sequences may reserve together
  int32_t max_token_bytes = 1;     // bytes of text the longest token stands for (MaxTokenBytes)
};

struct RequestLimits {
  int max_stop_sequences = 16;
  int max_stop_bytes = 256;
  int max_stop_token_ids = 16;
  int max_logit_bias = 300;            // entries of logit_bias (OpenAI's limit)
  int max_priority = 100;              // priorities are in [-max_priority, max_priority]
  int64_t max_prompt_bytes = 4 << 20;  // a text prompt's length
};

// The most bytes of text one token of `tokenizer` can stand for: its longest piece, special
// tokens' texts included (at least 1).
int32_t MaxTokenBytes(const Tokenizer& tokenizer);

// The request in `wire` (a serialized mer.v1.GenerateRequest). InvalidArgument naming the field
// when prompt.text or a stop sequence is not valid UTF-8 ("prompt.text: not valid UTF-8 at byte
// 17"), when both text and token_ids are set, or when the bytes are not a GenerateRequest.
absl::StatusOr<mer::v1::GenerateRequest> ParseGenerateRequest(absl::string_view wire);
// The same for a serialized mer.v1.TokenizeRequest (its field `text`).
absl::StatusOr<mer::v1::TokenizeRequest> ParseTokenizeRequest(absl::string_view wire);

// The checks of a text prompt that need no tokens: not empty, at most limits.max_prompt_bytes,
// valid UTF-8, and short enough to fit the context at all (at least ceil(bytes /
// max_token_bytes) tokens, plus BOS when `bos`). Done before the text is tokenized.
absl::Status CheckPromptText(absl::string_view text, bool bos, const ModelLimits& model, const RequestLimits& limits);

struct ValidatedRequest {
  mer::internal::v1::GenerateRequest compute;  // prompt ids, sampling, eos
  std::vector<std::string> stops;
  int32_t priority = 0;
  int64_t kv_tokens = 0;  // positions it reserves: prompt + max_new_tokens - 1
};

absl::StatusOr<ValidatedRequest> ValidateGenerateRequest(const mer::v1::GenerateRequest& request,
                                                         const Tokenizer& tokenizer, const ModelLimits& model,
                                                         const RequestLimits& limits = {});

}  // namespace mer::gateway
