// The model the trace tests record from: the micro preset cut to 3 layers, its router skewed so
// that routing follows the token (synth_model.h), loaded as the engines load a GGUF; and
// CpuEngines over it.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "common/model/expert_source.h"
#include "common/model/model_weights.h"
#include "common/model/synth_model.h"
#include "services/compute/cpu/cpu_engine.h"
#include "tests/unit/synth_weights.h"

namespace mer::testing_support {

struct TraceTestModel {
  SynthWeights model;
  std::unique_ptr<MappedExpertSource> experts;

  const ModelWeights& weights() const { return *model.weights; }

  // A CpuEngine of 2 threads and 64 context tokens that runs a prompt in chunks of
  // `max_batch_tokens` (a 6-token prompt in chunks of 4: 4 and 2).
  absl::StatusOr<std::unique_ptr<CpuEngine>> NewEngine(int max_batch_tokens) const {
    CpuEngineOptions o;
    o.threads = 2;
    o.max_batch_tokens = max_batch_tokens;
    o.max_context_tokens = 64;
    return CpuEngine::Create(weights(), *experts, o);
  }
};

// `name` tells apart the files of one test process (LoadSynthWeights).
inline absl::StatusOr<TraceTestModel> LoadTraceTestModel(const std::string& name) {
  SynthOptions o;
  o.geometry = *SynthPreset("micro");
  o.geometry.n_layer = 3;
  o.router_skew = 1.0;
  o.threads = 2;
  absl::StatusOr<SynthWeights> model = LoadSynthWeights(o, name);
  if (!model.ok()) return model.status();
  TraceTestModel m;
  m.model = std::move(*model);
  m.experts = std::make_unique<MappedExpertSource>(*m.model.weights);
  return m;
}

}  // namespace mer::testing_support
