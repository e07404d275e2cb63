// A first prefetch predictor: which experts the next layer of the token being computed will use,
// learnt online from the routing seen so far.
//
// Two kinds of counts, per destination layer L:
//   transitions  T[L][a][b]: a token used expert a at the layer before L (for L = 0: the previous
//                token's last layer) and expert b at L; S[L][a] counts the observations of a.
//   reuse        R[L][b]: the previous token used b at L and so did the next one; U[L][b] counts
//                how often a token used b at L and was followed by another token.
// The confidence that b will be used at L, given the current token's experts A at the layer before
// and the previous token's experts P at L, is the larger of
//   transition share  sum_a∈A T[L][a][b] / sum_a∈A S[L][a]      (a probability: each observation
//                                                                of a has k successors of which b
//                                                                is one or none)
//   reuse share       R[L][b] / U[L][b]   if b ∈ P
// each trusted only once its denominator reaches min_observations. Predict returns the experts of
// confidence >= threshold, most confident first (lower id first on ties), at most max_predictions.
//
// Counts age: a source row is halved when its count reaches count_limit, so the predictor follows
// routing that drifts. Memory: n_layer x n_expert^2 counters (uint32), allocated at construction;
// Observe and Predict do not allocate (Predict's output vector aside, once reserved).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace mer::residency {

struct PrefetchPredictorOptions {
  int32_t min_observations = 4;
  uint32_t count_limit = 1u << 16;
  bool use_transitions = true;
  bool use_reuse = true;
};

struct ExpertPrediction {
  int32_t expert = 0;
  float confidence = 0;
};

class PrefetchPredictor {
 public:
  // CHECK: n_layer >= 1, n_expert >= 1.
  PrefetchPredictor(int n_layer, int n_expert, const PrefetchPredictorOptions& options = {});

  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }

  // One token's experts at `layer` (distinct ids in [0, n_expert); CHECK). A token's layers are
  // observed in order 0, 1, ..., n_layer - 1, tokens in the order they are computed; a batch is
  // observed token by token.
  void Observe(int layer, absl::Span<const int32_t> experts);

  // The experts expected at `layer` for the token in flight: the layer before it has been
  // observed for this token (for layer 0: the previous token has been observed completely).
  // Replaces *out.
  void Predict(int layer, double threshold, int max_predictions, std::vector<ExpertPrediction>* out);

  // The two shares for one expert (tests, diagnostics); -1 where there is no trusted estimate.
  double TransitionShare(int layer, int expert) const;
  double ReuseShare(int layer, int expert) const;

  // Forgets every count and the tokens seen.
  void Reset();

 private:
  int PrevLayer(int layer) const { return layer == 0 ? n_layer_ - 1 : layer - 1; }
  uint32_t& T(int layer, int a, int b) { return trans_[(static_cast<size_t>(layer) * n_expert_ + a) * n_expert_ + b]; }
  uint32_t T(int layer, int a, int b) const {
    return trans_[(static_cast<size_t>(layer) * n_expert_ + a) * n_expert_ + b];
  }
  size_t LE(int layer, int e) const { return static_cast<size_t>(layer) * n_expert_ + e; }
  absl::Span<const int32_t> Recent(int layer) const {
    return absl::MakeConstSpan(recent_.data() + static_cast<size_t>(layer) * n_expert_, recent_n_[layer]);
  }

  const int n_layer_;
  const int n_expert_;
  const PrefetchPredictorOptions options_;
  std::vector<uint32_t> trans_;     // T [layer][a][b]
  std::vector<uint32_t> source_;    // S [layer][a]
  std::vector<uint32_t> reused_;    // R [layer][b]
  std::vector<uint32_t> followed_;  // U [layer][b]
  std::vector<int32_t> recent_;     // [layer][n_expert]: the latest token's experts at each layer
  std::vector<int32_t> recent_n_;   // [layer]
  std::vector<uint8_t> mark_;       // [n_expert] scratch
  std::vector<double> score_;       // [n_expert] scratch
};

}  // namespace mer::residency
