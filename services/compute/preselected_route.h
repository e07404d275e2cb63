// The check every backend applies to a layer's preselected routes (RouteOverride, backend.h)
// before it uses them, so that the cpu and the cuda backend refuse the same routes with the same
// message.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace mer {

// ids: int32 [n, k], each token's k ids distinct and in [0, n_expert); weights: f32 [n, k], each
// finite, or nullptr when the route gives none. InvalidArgument naming the layer, the token and
// the first bad id or weight (tokens in order, then ids in order).
absl::Status CheckPreselectedRoute(int layer, int n, int k, int n_expert, const int32_t* ids, const float* weights);

}  // namespace mer
