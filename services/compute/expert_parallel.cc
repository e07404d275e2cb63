#include "services/compute/expert_parallel.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"

namespace mer {

absl::StatusOr<ExpertPlacement> ExpertPlacement::Create(int n_ranks, int rank) {
  if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
    return absl::InvalidArgumentError(absl::StrCat("expert placement: rank ", rank, " of ", n_ranks, " ranks"));
  return ExpertPlacement(n_ranks, rank);
}

void ExpertPlacement::AssignRunners(int layer, absl::Span<const int32_t> experts, absl::Span<int32_t> runners,
                                    absl::Span<int64_t> load) const {
  CHECK(load.size() == static_cast<size_t>(n_ranks_));
  // Placed-once experts first: their pairs have one possible runner and set the loads that the
  // replicated experts' pairs then even out.
  std::fill(load.begin(), load.end(), 0);
  for (size_t i = 0; i < experts.size(); ++i) {
    runners[i] = IsReplicated(layer, experts[i]) ? -1 : experts[i] % n_ranks_;
    if (runners[i] >= 0) ++load[runners[i]];
  }
  if (replicated_.empty()) return;
  for (size_t i = 0; i < experts.size(); ++i) {
    if (runners[i] >= 0) continue;
    runners[i] = static_cast<int32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    ++load[runners[i]];
  }
}

HotExpertCounter::HotExpertCounter(int n_layer, int n_expert)
    : n_layer_(n_layer), n_expert_(n_expert), pairs_(size_t(n_layer) * n_expert, 0.0) {}

void HotExpertCounter::Count(int layer, absl::Span<const int32_t> experts) {
  if (layer < 0 || layer >= n_layer_) return;
  double* row = &pairs_[size_t(layer) * n_expert_];
  for (int32_t e : experts)
    if (e >= 0 && e < n_expert_) row[e] += 1.0;
}

std::vector<std::pair<int, int>> HotExpertCounter::ChooseAndAge(int per_layer) {
  std::vector<std::pair<int, int>> chosen;
  std::vector<int> order(n_expert_);
  for (int l = 0; l < n_layer_; ++l) {
    double* row = &pairs_[size_t(l) * n_expert_];
    std::iota(order.begin(), order.end(), 0);
    const int take = std::clamp(per_layer, 0, n_expert_);
    std::partial_sort(order.begin(), order.begin() + take, order.end(),
                      [row](int a, int b) { return row[a] != row[b] ? row[a] > row[b] : a < b; });
    for (int i = 0; i < take && row[order[i]] > 0; ++i) chosen.push_back({l, order[i]});
    for (int e = 0; e < n_expert_; ++e) row[e] *= 0.5;
  }
  return chosen;
}

}  // namespace mer
