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
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", p.repetition_penalty));
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Argmax(absl::Span<const float> logits) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int32_t Sampler::Sample(absl::Span<const float> logits, absl::Span<const int32_t> history) {
  const int32_t n = static_cast<int32_t>(logits.size());
  absl::Span<const float> scores = logits;
  if (params_.repetition_penalty != 1.0f && !history.empty()) {
    // Each distinct token of the history is penalised once, however often it occurred.
    work_.assign(logits.begin(), logits.end());
    ids_.assign(history.begin(), history.end());
    std::sort(ids_.begin(), ids_.end());
    ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
    for (int32_t id : ids_) {
      if (id < 0 || id >= n) continue;
      const float v = logits[id];
      work_[id] = v > 0 ? v / params_.repetition_penalty : v * params_.repetition_penalty;
    }
    scores = work_;
  }
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
  double sum = 0.0;  // the candidates' softmax mass, for top-p
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
