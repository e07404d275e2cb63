// Runs a routing trace's routes through a compute backend as preselected routes (backend.h's
// RouteOverride), so that a trace recorded on one backend can be run on another and the outputs
// compared bit for bit (`mer trace run`; docs/routing_trace.md, "Running a trace through a
// backend").
//
// The trace holds routes, not tokens: the prompt is given (the one the trace was recorded with),
// fed in the trace's prompt records' chunks, and each decode record is fed the greedy id of the
// record before it, so a greedy recording is run again on its own tokens. Every layer of every
// record is routed as the trace says, weighted by the router's probabilities of those experts
// (renormalised as the model says). Per record the result is the greedy id of its last token and
// a digest of all its rows' logits: equal digests mean equal logits, bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/compute/backend.h"
#include "tools/trace/routing_trace.h"

namespace mer::trace {

struct RouteReplayRecord {
  TracePhase phase = TracePhase::kDecode;
  int32_t n_tokens = 0;
  int32_t greedy = -1;  // Sampler::Argmax of the record's last token's logits
  uint64_t digest = 0;  // FNV-1a 64 of the bytes of the record's logits, f32 [n_tokens, n_vocab]
};

// FNV-1a 64 of `bytes` bytes, continuing from `hash` (the offset basis for a new digest).
inline constexpr uint64_t kFnv1aBasis = 0xcbf29ce484222325ull;
uint64_t Fnv1a64(const void* data, size_t bytes, uint64_t hash = kFnv1aBasis);

// Runs `trace` on sequence 0 of `engine` (cleared first; the route override is set for the run and
// cleared after it, also after an error). InvalidArgument when the trace's geometry is not the
// model's, `prompt` is not as long as the trace's prompt records (which must come first, at least
// one), a decode record has more than one token, a record is larger than the engine's
// max_batch_tokens or the whole longer than its context, or a prompt id is outside the
// vocabulary; Unimplemented when the engine takes no preselected routes (or runs a record without
// asking for them); the engine's errors with the record named.
absl::StatusOr<std::vector<RouteReplayRecord>> ReplayRoutes(ComputeBackend& engine, const RoutingTrace& trace,
                                                            absl::Span<const int32_t> prompt);

}  // namespace mer::trace
