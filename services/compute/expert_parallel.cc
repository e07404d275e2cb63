#include "services/compute/expert_parallel.h"

#include <algorithm>
#include <cstdint>

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

}  // namespace mer
