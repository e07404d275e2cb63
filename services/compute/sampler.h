// Token sampling from logits: greedy, or temperature with top-k and top-p (nucleus) filtering,
// with a repetition penalty. Deterministic for a given seed and sequence of calls: one uniform draw
// per token, walked over the candidates in score order (lower id first on ties) when top-k or
// top-p truncates, in id order when nothing does (no sort of the vocabulary then).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace mer {

struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = 0;                // keep the k most likely; 0 = all
  float top_p = 1.0f;               // keep the smallest set with probability mass >= top_p; (0, 1]
  uint64_t seed = 0;                // random stream of this sequence
  float repetition_penalty = 1.0f;  // > 1 discourages tokens already seen (CTRL-style); 1 = off
};

// InvalidArgument naming the field when out of range.
absl::Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token from `logits` (n_vocab values). `history` is the sequence so far (prompt
  // and generated), used by the repetition penalty. Reuses internal buffers: no allocation after the first call.
  int32_t Sample(absl::Span<const float> logits, absl::Span<const int32_t> history);

  // Index of the largest value, lowest index on ties (NaNs never win; a NaN at index 0 stays).
  static int32_t Argmax(absl::Span<const float> logits);
  // Sample(logits, history) is Argmax(logits) whatever the history: greedy without a repetition
  // penalty, so a backend may take the argmax itself (ComputeBackend::ForwardArgmax).
  bool IsPlainArgmax() const { return params_.temperature == 0.0f && params_.repetition_penalty == 1.0f; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> ids_;
  std::vector<float> probs_;
};

}  // namespace mer
