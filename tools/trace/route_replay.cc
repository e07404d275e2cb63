#include "tools/trace/route_replay.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "services/compute/sampler.h"

namespace mer::trace {
namespace {

// The routes of the record being run, every layer, without weights.
class TraceRoutes final : public RouteOverride {
 public:
  explicit TraceRoutes(const RoutingTrace& trace) : trace_(trace) {}

  void set_record(size_t record) { record_ = record; }
  int64_t calls() const { return calls_; }

  bool Route(int layer, int n, int k, int32_t* ids, float*, bool* has_weights) override {
    // Each record is run as the batch it was recorded as, on a model of the trace's geometry.
    CHECK(layer >= 0 && layer < trace_.geometry().n_layer && k == trace_.geometry().top_k);
    const absl::Span<const uint16_t> r = trace_.Experts(record_, layer);
    CHECK(r.size() == static_cast<size_t>(n) * k);
    std::copy(r.begin(), r.end(), ids);
    *has_weights = false;
    ++calls_;
    return true;
  }

 private:
  const RoutingTrace& trace_;
  size_t record_ = 0;
  int64_t calls_ = 0;
};

absl::Status CheckReplayable(const ComputeBackend& engine, const RoutingTrace& trace,
                             absl::Span<const int32_t> prompt) {
  const ModelConfig& c = engine.config();
  const TraceGeometry& g = trace.geometry();
  if (g.n_layer != c.n_layer || g.n_expert != c.n_expert || g.top_k != c.n_expert_used)
    return absl::InvalidArgumentError(absl::StrCat("the trace's geometry (", g.n_layer, " layers x ", g.n_expert,
                                                   " experts, top-", g.top_k, ") is not the model's (", c.n_layer,
                                                   " x ", c.n_expert, ", top-", c.n_expert_used, ")"));
  const auto& records = trace.records();
  if (records.empty() || records[0].phase != TracePhase::kPrompt)
    return absl::InvalidArgumentError("the trace does not begin with a prompt record");
  for (size_t r = 0; r < records.size(); ++r) {
    if (r > 0 && records[r].phase == TracePhase::kPrompt && records[r - 1].phase == TracePhase::kDecode)
      return absl::InvalidArgumentError(absl::StrCat("record ", r, " is a prompt record after a decode record"));
    if (records[r].phase == TracePhase::kDecode && records[r].n_tokens != 1)
      return absl::InvalidArgumentError(
          absl::StrCat("decode record ", r, " has ", records[r].n_tokens, " tokens (one per decode step is run)"));
    if (records[r].n_tokens > engine.max_batch_tokens())
      return absl::InvalidArgumentError(absl::StrCat("record ", r, " has ", records[r].n_tokens,
                                                     " tokens, more than the engine's batch of ",
                                                     engine.max_batch_tokens()));
  }
  if (trace.prompt_tokens() != static_cast<int64_t>(prompt.size()))
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", prompt.size(), " tokens, the trace's prompt ", trace.prompt_tokens()));
  if (trace.tokens() > engine.max_context_tokens())
    return absl::InvalidArgumentError(
        absl::StrCat("the trace's ", trace.tokens(), " tokens exceed the context of ", engine.max_context_tokens()));
  for (int32_t id : prompt)
    if (id < 0 || id >= c.n_vocab)
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", id, " is outside the vocabulary"));
  return absl::OkStatus();
}

}  // namespace

uint64_t Fnv1a64(const void* data, size_t bytes, uint64_t hash) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 0x100000001b3ull;
  return hash;
}

absl::StatusOr<std::vector<RouteReplayRecord>> ReplayRoutes(ComputeBackend& engine, const RoutingTrace& trace,
                                                            absl::Span<const int32_t> prompt) {
  RETURN_IF_ERROR(CheckReplayable(engine, trace, prompt));
  const int V = engine.config().n_vocab;
  const int n_layer = engine.config().n_layer;
  TraceRoutes routes(trace);
  RETURN_IF_ERROR(engine.set_route_override(&routes));
  std::vector<RouteReplayRecord> out;
  std::vector<BatchToken> batch;
  std::vector<float> logits;
  engine.ClearSequence(0);
  int32_t position = 0;
  size_t next_prompt = 0;
  absl::Status status;
  for (size_t r = 0; r < trace.records().size() && status.ok(); ++r) {
    const RoutingTrace::Record& rec = trace.records()[r];
    batch.clear();
    for (int32_t i = 0; i < rec.n_tokens; ++i) {
      const int32_t token = rec.phase == TracePhase::kPrompt ? prompt[next_prompt++] : out.back().greedy;
      batch.push_back({token, position++, 0, true});
    }
    logits.resize(static_cast<size_t>(rec.n_tokens) * V);
    routes.set_record(r);
    const int64_t calls = routes.calls();
    status = engine.Forward(batch, logits.data());
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("record ", r, ": ", status.message()));
    } else if (routes.calls() != calls + n_layer) {
      status = absl::UnimplementedError(absl::StrCat("the engine ran record ", r, " asking for the routes of ",
                                                     routes.calls() - calls, " of its ", n_layer, " layers"));
    } else {
      RouteReplayRecord o;
      o.phase = rec.phase;
      o.n_tokens = rec.n_tokens;
      o.greedy = Sampler::Argmax(absl::MakeConstSpan(logits.data() + static_cast<size_t>(rec.n_tokens - 1) * V, V));
      o.digest = Fnv1a64(logits.data(), logits.size() * sizeof(float));
      out.push_back(o);
    }
  }
  RETURN_IF_ERROR(engine.set_route_override(nullptr));
  RETURN_IF_ERROR(status);
  return out;
}

}  // namespace mer::trace
