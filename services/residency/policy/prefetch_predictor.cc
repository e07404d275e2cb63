#include "services/residency/policy/prefetch_predictor.h"

#include <algorithm>

#include "common/base/check.h"

namespace mer::residency {

PrefetchPredictor::PrefetchPredictor(int n_layer, int n_expert, const PrefetchPredictorOptions& options)
    : n_layer_(n_layer), n_expert_(n_expert), options_(options) {
  CHECK(n_layer >= 1 && n_expert >= 1);
  CHECK(options.count_limit >= 2);
  trans_.assign(static_cast<size_t>(n_layer) * n_expert * n_expert, 0);
  source_.assign(static_cast<size_t>(n_layer) * n_expert, 0);
  reused_.assign(source_.size(), 0);
  followed_.assign(source_.size(), 0);
  recent_.assign(source_.size(), 0);
  recent_n_.assign(n_layer, 0);
  mark_.assign(n_expert, 0);
  score_.assign(n_expert, 0);
}

void PrefetchPredictor::Reset() {
  std::fill(trans_.begin(), trans_.end(), 0);
  std::fill(source_.begin(), source_.end(), 0);
  std::fill(reused_.begin(), reused_.end(), 0);
  std::fill(followed_.begin(), followed_.end(), 0);
  std::fill(recent_n_.begin(), recent_n_.end(), 0);
}

void PrefetchPredictor::Observe(int layer, absl::Span<const int32_t> experts) {
  CHECK(layer >= 0 && layer < n_layer_);
  CHECK(experts.size() <= static_cast<size_t>(n_expert_));
  for (int32_t b : experts) {
    CHECK(b >= 0 && b < n_expert_);
    CHECK_MSG(!mark_[b], "duplicate expert in one token's routing");
    mark_[b] = 1;
  }
  // Transitions from the layer before (this token's, or the previous token's last layer).
  for (int32_t a : Recent(PrevLayer(layer))) {
    uint32_t& s = source_[LE(layer, a)];
    if (s + 1 >= options_.count_limit) {  // age the row
      s >>= 1;
      for (int b = 0; b < n_expert_; ++b) T(layer, a, b) >>= 1;
    }
    ++s;
    for (int32_t b : experts) ++T(layer, a, b);
  }
  // Reuse of the previous token's experts at this layer.
  for (int32_t b : Recent(layer)) {
    uint32_t& u = followed_[LE(layer, b)];
    uint32_t& r = reused_[LE(layer, b)];
    if (u + 1 >= options_.count_limit) {
      u >>= 1;
      r >>= 1;
    }
    ++u;
    r += mark_[b];
  }
  for (int32_t b : experts) mark_[b] = 0;
  std::copy(experts.begin(), experts.end(), recent_.begin() + LE(layer, 0));
  recent_n_[layer] = static_cast<int32_t>(experts.size());
}

double PrefetchPredictor::TransitionShare(int layer, int expert) const {
  uint64_t num = 0, den = 0;
  for (int32_t a : Recent(PrevLayer(layer))) {
    num += T(layer, a, expert);
    den += source_[LE(layer, a)];
  }
  if (den == 0 || den < static_cast<uint64_t>(options_.min_observations)) return -1;
  return static_cast<double>(num) / static_cast<double>(den);
}

double PrefetchPredictor::ReuseShare(int layer, int expert) const {
  const uint32_t u = followed_[LE(layer, expert)];
  if (u == 0 || u < static_cast<uint32_t>(options_.min_observations)) return -1;
  return static_cast<double>(reused_[LE(layer, expert)]) / u;
}

void PrefetchPredictor::Predict(int layer, double threshold, int max_predictions, std::vector<ExpertPrediction>* out) {
  CHECK(layer >= 0 && layer < n_layer_);
  out->clear();
  if (max_predictions <= 0) return;
  std::fill(score_.begin(), score_.end(), -1.0);
  if (options_.use_transitions) {
    uint64_t den = 0;
    for (int32_t a : Recent(PrevLayer(layer))) den += source_[LE(layer, a)];
    if (den > 0 && den >= static_cast<uint64_t>(options_.min_observations)) {
      for (int b = 0; b < n_expert_; ++b) {
        uint64_t num = 0;
        for (int32_t a : Recent(PrevLayer(layer))) num += T(layer, a, b);
        score_[b] = static_cast<double>(num) / static_cast<double>(den);
      }
    }
  }
  if (options_.use_reuse) {
    for (int32_t b : Recent(layer)) score_[b] = std::max(score_[b], ReuseShare(layer, b));
  }
  for (int b = 0; b < n_expert_; ++b) {
    if (score_[b] >= threshold && score_[b] > 0) out->push_back({b, static_cast<float>(score_[b])});
  }
  const auto better = [](const ExpertPrediction& x, const ExpertPrediction& y) {
    return x.confidence != y.confidence ? x.confidence > y.confidence : x.expert < y.expert;
  };
  if (static_cast<int>(out->size()) > max_predictions) {
    std::partial_sort(out->begin(), out->begin() + max_predictions, out->end(), better);
    out->resize(max_predictions);
  } else {
    std::sort(out->begin(), out->end(), better);
  }
}

}  // namespace mer::residency
