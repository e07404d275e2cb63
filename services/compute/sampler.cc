#include "services/compute/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace mer {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return absl::InvalidArgumentError(absl::StrCat("temperature must be >= 0, got ", p.temperature));
  if (p.top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", p.top_p));
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty must be > 0, got ", p.repetition_penalty));
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", p.min_p));
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return absl::InvalidArgumentError(absl::StrCat("presence_penalty must be in [-2, 2], got ", p.presence_penalty));
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return absl::InvalidArgumentError(absl::StrCat("frequency_penalty must be in [-2, 2], got ", p.frequency_penalty));
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("logit_bias: token ", id, " is negative"));
    if (!(bias >= -100.0f && bias <= 100.0f))
      return absl::InvalidArgumentError(absl::StrCat("logit_bias[", id, "] must be in [-100, 100], got ", bias));
  }
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params)
    : params_(params),
      adjusts_logits_(params.repetition_penalty != 1.0f || params.presence_penalty != 0.0f ||
                      params.frequency_penalty != 0.0f || !params.logit_bias.empty()),
      rng_(params.seed) {}

int32_t Sampler::Argmax(absl::Span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

void Sampler::Logprobs(absl::Span<const float> logits, int32_t token, int top_n, TokenLogprobs* out) {
  const int32_t n = static_cast<int32_t>(logits.size());
  float max = logits[0];
  for (int32_t i = 1; i < n; ++i) max = std::max(max, logits[i]);
  double sum = 0.0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  out->logprob = static_cast<float>(logits[token] - log_z);
  out->top_ids.clear();
  out->top_logprobs.clear();
  top_n = std::min(top_n, n);
  // A running top-n by insertion: n is at most 20, the vocabulary is scanned once.
  for (int32_t i = 0; i < n && top_n > 0; ++i) {
    const size_t size = out->top_ids.size();
    if (size == static_cast<size_t>(top_n) && logits[i] <= logits[out->top_ids.back()]) continue;
    size_t at = size;
    while (at > 0 && logits[i] > logits[out->top_ids[at - 1]]) --at;
    out->top_ids.insert(out->top_ids.begin() + at, i);
    if (out->top_ids.size() > static_cast<size_t>(top_n)) out->top_ids.pop_back();
  }
  for (int32_t id : out->top_ids) out->top_logprobs.push_back(static_cast<float>(logits[id] - log_z));
}

absl::Span<const float> Sampler::Adjust(absl::Span<const float> logits, absl::Span<const int32_t> history) {
  if (!adjusts_logits_) return logits;
  const int32_t n = static_cast<int32_t>(logits.size());
  work_.assign(logits.begin(), logits.end());
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id < n) work_[id] += bias;
  }
  if (params_.repetition_penalty != 1.0f && !history.empty()) {
    // Each distinct token of the history is penalised once, however often it occurred.
    ids_.assign(history.begin(), history.end());
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
    for (int32_t id : ids_) {
      if (id < 0 || id >= n) continue;
      const float v = work_[id];
      work_[id] = v > 0 ? v / params_.repetition_penalty : v * params_.repetition_penalty;
    }
  }
  for (int32_t id : generated_) {
    work_[id] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(counts_[id]);
  }
  return work_;
}

int32_t Sampler::Sample(absl::Span<const float> logits, absl::Span<const int32_t> history) {
  const int32_t token = Pick(Adjust(logits, history));
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    if (counts_.empty()) counts_.assign(logits.size(), 0);
    if (counts_[token]++ == 0) generated_.push_back(token);
  }
  return token;
}

int32_t Sampler::Pick(absl::Span<const float> scores) {
  const int32_t n = static_cast<int32_t>(scores.size());
  if (params_.temperature == 0.0f) return Argmax(scores);

  const float inv_t = 1.0f / params_.temperature;
  std::vector<float>& probs = probs_;  // capacity grows once to n_vocab
  const int32_t k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;

  if (k == n && params_.top_p >= 1.0f) {
    // Nothing to truncate: draw straight from the softmax, walking the vocabulary in id order.
    // (A full sort of a 151,936-token vocabulary took ~30 ms a token, more than a GPU step.)
    float max = scores[0];
    for (int32_t i = 1; i < n; ++i) max = std::max(max, scores[i]);
    probs.resize(n);
    double sum = 0.0;
    for (int32_t i = 0; i < n; ++i) {
      probs[i] = std::exp((scores[i] - max) * inv_t);
      if (probs[i] < params_.min_p) probs[i] = 0.0f;  // relative to the top token's, which is 1
      sum += probs[i];
    }
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * sum;
    double acc = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (probs[i] == 0.0f) continue;
      acc += probs[i];
      last = i;
      if (u < acc) return i;
    }
    return last;
  }

  // Candidates by score (lower id first on ties): the top-k, sorted as far as the nucleus needs.
  // A small k is sorted at once; for a large one the nucleus usually lies in the first couple of
  // thousand, so those are sorted first and the rest only when the nucleus reaches past them.
  ids_.resize(n);
  std::iota(ids_.begin(), ids_.end(), 0);
  const auto by_score = [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  constexpr int32_t kFirstSort = 2048;
  int32_t sorted = std::min(k, kFirstSort);
  if (params_.top_p >= 1.0f) sorted = k;
  if (k < n && sorted < k)  // the top-k set first, unordered, so that its mass is known
    std::nth_element(ids_.begin(), ids_.begin() + (k - 1), ids_.end(), by_score);
  std::partial_sort(ids_.begin(), ids_.begin() + sorted, ids_.begin() + (sorted < k ? k : n), by_score);
  ids_.resize(k);
  const float max = scores[ids_[0]];  // the best candidate: sorted first
  double sum = 0.0;                   // the candidates' softmax mass, for top-p
  for (int32_t i = 0; i < k; ++i) sum += std::exp((scores[ids_[i]] - max) * inv_t);
  int32_t keep = k;
  for (;;) {
    probs.resize(sorted);
    for (int32_t i = 0; i < sorted; ++i) probs[i] = std::exp((scores[ids_[i]] - max) * inv_t);
    if (params_.top_p >= 1.0f) break;
    double mass = 0.0;
    int32_t reached = -1;
    for (int32_t i = 0; i < sorted && reached < 0; ++i) {
      mass += probs[i] / sum;
      if (mass >= params_.top_p) reached = i + 1;
    }
    if (reached > 0 || sorted == k) {
      keep = reached > 0 ? reached : k;
      break;
    }
    std::sort(ids_.begin() + sorted, ids_.end(), by_score);  // the nucleus is wider: sort the rest
    sorted = k;
  }
  // min-p last: candidates are in score order and probs[0], the top one's, is 1.
  while (keep > 1 && probs[keep - 1] < params_.min_p) --keep;
  double kept = 0.0;
  for (int32_t i = 0; i < keep; ++i) kept += probs[i];
  // One uniform draw in [0, kept): a fixed number of RNG calls per step keeps streams reproducible.
  const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) * kept;
  double acc = 0.0;
  for (int32_t i = 0; i < keep; ++i) {
    acc += probs[i];
    if (u < acc) return ids_[i];
  }
  return ids_[keep - 1];
}

}  // namespace mer
