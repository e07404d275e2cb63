// Checks a public GenerateRequest against the served model before it is queued, and turns it
// into the internal request. Every rejection is InvalidArgument with a message that starts with
// the offending field's name ("max_new_tokens: must be >= 1, got 0").
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "mer/internal/v1/compute.pb.h"
#include "mer/v1/mer.pb.h"

namespace mer::gateway {

// What the served model allows (from mer-compute's GetInfo).
struct ModelLimits {
  int32_t vocab_size = 0;
  int32_t max_context_tokens = 0;  // positions per sequence
  int64_t kv_budget_tokens = 0;    // positions all sequences may reserve together
};

struct RequestLimits {
  int max_stop_sequences = 16;
  int max_stop_bytes = 256;
  int max_stop_token_ids = 16;
  int max_logit_bias = 300;  // entries of logit_bias (OpenAI's limit)
  int max_priority = 100;    // priorities are in [-max_priority, max_priority]
};

struct ValidatedRequest {
  mer::internal::v1::GenerateRequest compute;  // prompt ids, sampling, eos
  std::vector<std::string> stops;
  int32_t priority = 0;
  int64_t kv_tokens = 0;  // positions it reserves: prompt + max_new_tokens - 1
};

absl::StatusOr<ValidatedRequest> ValidateGenerateRequest(const mer::v1::GenerateRequest& request,
                                                         const Tokenizer& tokenizer,
                                                         const ModelLimits& model,
                                                         const RequestLimits& limits = {});

}  // namespace mer::gateway
