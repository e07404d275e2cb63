// Token sampling from logits: greedy, or temperature with top-k, top-p (nucleus) and min-p
// filtering; with a logit bias, a repetition penalty (prompt and output) and OpenAI's presence and
// frequency penalties (output only, as vLLM applies them). Deterministic for a given seed and sequence of calls: one uniform draw
// per token, walked over the candidates in score order (lower id first on ties) when top-k or
// top-p truncates, in id order when nothing does (no sort of the vocabulary then).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace mer {

struct SamplingParams {
  float temperature = 0.0f;                           // 0 = greedy (argmax, lowest id on ties)
  int32_t top_k = 0;                                  // keep the k most likely; 0 = all
  float top_p = 1.0f;                                 // keep the smallest set with probability mass >= top_p; (0, 1]
  uint64_t seed = 0;                                  // random stream of this sequence
  float repetition_penalty = 1.0f;                    // > 1 discourages tokens already seen (CTRL-style); 1 = off
  float min_p = 0.0f;                                 // keep tokens with probability >= min_p * the top one's; [0, 1]
  float presence_penalty = 0.0f;                      // subtracted from the logit of every token already generated
  float frequency_penalty = 0.0f;                     // subtracted once per time a token was generated; both [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, added to its logit), [-100, 100]
};

// Log-probabilities of one sampled token under the model's distribution: the log-softmax of the
// raw logits (before the bias, penalties, temperature and truncation, as vLLM reports them).
struct TokenLogprobs {
  float logprob = 0;             // of the sampled token
  std::vector<int32_t> top_ids;  // the most likely tokens, most likely first (lower id on ties)
  std::vector<float> top_logprobs;
};

// InvalidArgument naming the field when out of range.
absl::Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token from `logits` (n_vocab values). `history` is the sequence so far (prompt
  // and generated), used by the repetition penalty; the presence and frequency penalties count
  // the tokens this sampler returned. Reuses internal buffers: no allocation after the first call.
  int32_t Sample(absl::Span<const float> logits, absl::Span<const int32_t> history);

  // The log-probabilities of `token` and of the `top_n` most likely tokens under `logits`.
  static void Logprobs(absl::Span<const float> logits, int32_t token, int top_n, TokenLogprobs* out);

  // Index of the largest value, lowest index on ties (NaNs never win; a NaN at index 0 stays).
  static int32_t Argmax(absl::Span<const float> logits);
  // Sample(logits, history) is Argmax(logits) whatever the history: greedy without a repetition
  // penalty, so a backend may take the argmax itself (ComputeBackend::ForwardArgmax).
  bool IsPlainArgmax() const { return params_.temperature == 0.0f && !adjusts_logits_; }

 private:
  // Greedy, or a draw under temperature, top-k, then top-p, then min-p.
  int32_t Pick(absl::Span<const float> scores);
  // The logits after the bias and the penalties (`logits` itself when there are none).
  absl::Span<const float> Adjust(absl::Span<const float> logits, absl::Span<const int32_t> history);

  SamplingParams params_;
  bool adjusts_logits_;             // a bias or a penalty is set
  std::vector<int32_t> counts_;     // [n_vocab] times each token was returned (with the penalties)
  std::vector<int32_t> generated_;  // the distinct tokens returned, for the penalties
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> ids_;
  std::vector<float> probs_;
};

}  // namespace mer
