// The one narrow door through which the forward pass reaches expert weights: "make these experts
// of layer l readable, give me their weights". Behind it: the GGUF mapping (everything resident),
// or the residency tiers (RAM slots filled from the expert store on demand).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/model_weights.h"

namespace mer {

// The tensor types of one layer's expert matrices (gate, up, down).
struct ExpertTypes {
  GgmlType gate = GgmlType::kF32;
  GgmlType up = GgmlType::kF32;
  GgmlType down = GgmlType::kF32;
};

// Page-locks [base, base + bytes) of this process's address space for a backend's DMA and returns
// a handle that unlocks it when its last copy is destroyed; the memory must stay mapped until then.
// An error leaves the memory pageable (uploads from it still work, through the driver's staging).
// Given by a backend that uploads from host memory (backend_factory.h: HostMemoryPinnerFor) to a
// source whose memory is not the model file's mapping (a RAM tier in shared memory).
using HostMemoryPinner = std::function<absl::StatusOr<std::shared_ptr<void>>(void* base, size_t bytes)>;

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;

  // Makes experts[i] of `layer` readable and writes its weights to out[i]. Blocks until all are
  // available. The views stay valid, and their memory is not reused, until ReleaseLayer(layer).
  // Errors (returned, never thrown): Unavailable when the tier behind is down, DataLoss when an
  // expert cannot be read intact. Called at most once per layer between releases; experts.size()
  // is at most max_experts_per_acquire().
  virtual absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) = 0;
  virtual void ReleaseLayer(int layer) = 0;

  // The most experts one AcquireLayer may ask for. A caller that needs more of a layer acquires
  // them in groups, releasing each group before acquiring the next: that is how a RAM tier
  // holding fewer slots than a layer has experts still serves a prompt batch routed to all of them.
  virtual int max_experts_per_acquire() const { return std::numeric_limits<int>::max(); }

  // The types of `layer`'s expert matrices, known without an acquire (the model file's tensors, an
  // expert store's manifest): for a backend that sizes its buffers before the first step. Views
  // from AcquireLayer have these types. nullopt where the source cannot tell.
  virtual std::optional<ExpertTypes> expert_types(int layer) const { return std::nullopt; }
};

// Every expert straight from the model file's mapping; never fails, never blocks.
class MappedExpertSource final : public ExpertSource {
 public:
  explicit MappedExpertSource(const ModelWeights& weights) : weights_(weights) {}

  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    for (size_t i = 0; i < experts.size(); ++i) out[i] = weights_.Expert(layer, experts[i]);
    return absl::OkStatus();
  }
  void ReleaseLayer(int) override {}
  std::optional<ExpertTypes> expert_types(int layer) const override {
    const LayerWeights& l = weights_.layers[layer];
    if (l.gate_exps.data == nullptr) return std::nullopt;  // dense weights only (LoadDense)
    return ExpertTypes{l.gate_exps.type, l.up_exps.type, l.down_exps.type};
  }

 private:
  const ModelWeights& weights_;
};

}  // namespace mer
