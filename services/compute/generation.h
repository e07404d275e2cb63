// One sequence through a compute backend: chunked prompt processing, then the decode loop; and
// teacher-forced scoring (the logits at every position of a given continuation), which is how
// the engine is compared with llama.cpp step by step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/compute/backend.h"
#include "services/compute/sampler.h"

namespace mer {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // non-empty
  int32_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation stops after emitting one of these (its end-of-generation tokens)
  int32_t top_logprobs = -1;      // >= 0: each token's log-probability and that many alternatives (Batcher)

  bool IsStop(int32_t token) const { return std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end(); }
};

struct GenerationStats {
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  double prompt_seconds = 0;  // prompt processing, until the first token's logits
  double ttft_seconds = 0;    // until the first generated token is known
  double decode_seconds = 0;  // the remaining tokens
};

// Runs `request` on KV slot `sequence` (cleared first). `on_token` (may be empty) sees each
// generated id as soon as it is sampled. Returns the generated ids.
absl::StatusOr<std::vector<int32_t>> Generate(ComputeBackend& engine, int sequence, const GenerationRequest& request,
                                              const std::function<void(int32_t)>& on_token,
                                              GenerationStats* stats = nullptr);

// Writes the logits predicting continuation[i] after prompt + continuation[0..i) to row i of
// `logits` ([continuation.size(), n_vocab]).
absl::Status Score(ComputeBackend& engine, int sequence, absl::Span<const int32_t> prompt,
                   absl::Span<const int32_t> continuation, float* logits);

}  // namespace mer
