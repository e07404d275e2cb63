#include "services/compute/preselected_route.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace mer {

absl::Status CheckPreselectedRoute(int layer, int n, int k, int n_expert, const int32_t* ids, const float* weights) {
  for (int t = 0; t < n; ++t) {
    const int32_t* chosen = ids + int64_t(t) * k;
    for (int j = 0; j < k; ++j) {
      if (chosen[j] < 0 || chosen[j] >= n_expert || std::find(chosen, chosen + j, chosen[j]) != chosen + j)
        return absl::InvalidArgumentError(absl::StrCat("preselected route of layer ", layer, ", token ", t, ": expert ",
                                                       chosen[j], " is out of range or repeated"));
      if (weights != nullptr && !std::isfinite(weights[int64_t(t) * k + j]))
        return absl::InvalidArgumentError(
            absl::StrCat("preselected route of layer ", layer, ", token ", t, ": a weight is not finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace mer
