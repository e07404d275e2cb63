// Routes recorded from a backend and given back as preselected routes (backend.h): the cpu engine's
// test and the cuda backend's against it (tests/gpu/cuda_engine_test.cc) share it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "services/compute/backend.h"

namespace mer::test {

// Records every layer's routing of every step while `recording` (a RoutingObserver), and gives the
// steps back in the same order as preselected routes (a RouteOverride): step s's layer l to the
// s-th Route of layer l since Rewind(). A step begins with layer 0 (backends ask in layer order).
class RecordedRoutes final : public RoutingObserver, public RouteOverride {
 public:
  enum class Given {
    kRecorded,         // the recorded ids, the router's weights
    kShifted,          // each token's first id replaced by the lowest id it did not choose; router's weights
    kShiftedWeighted,  // kShifted's ids with weights of their own (not normalised)
  };

  void OnRouting(int layer, absl::Span<const int32_t> ids, int) override {
    if (!recording) return;
    if (layer == 0) steps_.emplace_back();
    ASSERT_FALSE(steps_.empty());
    ASSERT_EQ(steps_.back().size(), static_cast<size_t>(layer));
    steps_.back().emplace_back(ids.begin(), ids.end());
  }

  bool Route(int layer, int n, int k, int32_t* ids, float* weights, bool* has_weights) override {
    if (layer == 0) step_ = next_step_++;
    EXPECT_LT(step_, steps_.size()) << "more steps given than recorded";
    if (step_ >= steps_.size()) return false;
    const std::vector<int32_t>& r = steps_[step_].at(layer);
    EXPECT_EQ(r.size(), static_cast<size_t>(n * k)) << "step " << step_ << " layer " << layer;
    if (r.size() != static_cast<size_t>(n * k)) return false;
    std::copy(r.begin(), r.end(), ids);
    for (int t = 0; given != Given::kRecorded && t < n; ++t) {
      int32_t free_id = 0;
      while (std::find(ids + t * k, ids + (t + 1) * k, free_id) != ids + (t + 1) * k) ++free_id;
      ids[t * k] = free_id;
    }
    *has_weights = given == Given::kShiftedWeighted;
    for (int i = 0; *has_weights && i < n * k; ++i) weights[i] = 0.75f / float(1 + i % k) + 0.01f * float(i / k % 7);
    return true;
  }

  void Rewind() { next_step_ = 0; }
  size_t steps() const { return steps_.size(); }
  // Steps given since Rewind().
  size_t given_steps() const { return next_step_; }

  bool recording = true;
  Given given = Given::kRecorded;

 private:
  std::vector<std::vector<std::vector<int32_t>>> steps_;  // [step][layer] -> ids [n, k]
  size_t step_ = 0, next_step_ = 0;
};

}  // namespace mer::test
