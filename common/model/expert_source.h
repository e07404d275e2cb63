// The one narrow door through which the forward pass reaches expert weights: "make these experts
// of layer l readable, give me their weights". Behind it: the GGUF mapping (everything resident),
// or the residency tiers (RAM slots filled from the expert store on demand).
#pragma once

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/model_weights.h"

namespace mer {

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;

  // Makes experts[i] of `layer` readable and writes its weights to out[i]. Blocks until all are
  // available. The views stay valid, and their memory is not reused, until ReleaseLayer(layer).
  // Errors (returned, never thrown): Unavailable when the tier behind is down, DataLoss when an
  // expert cannot be read intact. Called at most once per layer between releases; experts.size()
  // is at most max_experts_per_acquire().
  virtual absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts,
                                    absl::Span<ExpertWeights> out) = 0;
  virtual void ReleaseLayer(int layer) = 0;

  // The most experts one AcquireLayer may ask for. A caller that needs more of a layer acquires
  // them in groups, releasing each group before acquiring the next: that is how a RAM tier
  // holding fewer slots than a layer has experts still serves a prompt batch routed to all of them.
  virtual int max_experts_per_acquire() const { return std::numeric_limits<int>::max(); }
};

// Every expert straight from the model file's mapping; never fails, never blocks.
class MappedExpertSource final : public ExpertSource {
 public:
  explicit MappedExpertSource(const ModelWeights& weights) : weights_(weights) {}

  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts,
                            absl::Span<ExpertWeights> out) override {
    for (size_t i = 0; i < experts.size(); ++i) out[i] = weights_.Expert(layer, experts[i]);
    return absl::OkStatus();
  }
  void ReleaseLayer(int) override {}

 private:
  const ModelWeights& weights_;
};

}  // namespace mer
