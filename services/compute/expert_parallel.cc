#include "services/compute/expert_parallel.h"

#include "absl/strings/str_cat.h"

namespace mer {

absl::StatusOr<ExpertPlacement> ExpertPlacement::Create(int n_ranks, int rank) {
  if (n_ranks < 1 || rank < 0 || rank >= n_ranks)
    return absl::InvalidArgumentError(absl::StrCat("expert placement: rank ", rank, " of ", n_ranks, " ranks"));
  return ExpertPlacement(n_ranks, rank);
}

}  // namespace mer
