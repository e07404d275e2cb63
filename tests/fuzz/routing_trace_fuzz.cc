// libFuzzer target for the routing trace reader (tools/trace/routing_trace.h) and the
// replay simulator: arbitrary bytes must give either a trace or an error, never a crash, an
// out-of-bounds read (ASan) or undefined behaviour (UBSan). The format is canonical, so a trace
// that parses must encode back to exactly the input bytes; small valid traces are also replayed
// under every policy, with and without prefetch, and the counters checked for consistency.
//
//   ./build-fuzz/bin/routing_trace_fuzz -max_total_time=60 tests/fuzz/corpus/routing_trace
//
// The seeds in tests/fuzz/corpus/routing_trace are written by routing_trace_test
// (MER_TRACE_CORPUS_DIR=tests/fuzz/corpus/routing_trace, see WriteSeedCorpus there).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/types/span.h"
#include "services/residency/policy/replacement_policy.h"
#include "tools/trace/replay.h"
#include "tools/trace/routing_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto trace = mer::trace::ParseTrace(absl::MakeConstSpan(data, size));
  if (!trace.ok()) return 0;
  const std::string again = mer::trace::EncodeTrace(*trace);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();

  const mer::trace::TraceGeometry& g = trace->geometry();
  const int64_t predictor_counts = int64_t{g.n_layer} * g.n_expert * g.n_expert;
  if (predictor_counts > (1 << 20) || trace->tokens() * g.n_layer > (1 << 16)) return 0;
  for (const std::string& policy : mer::residency::PolicyNames()) {
    for (int64_t slots : {int64_t{1}, mer::trace::SlotsForFraction(g, 0.25)}) {
      for (bool prefetch : {false, true}) {
        mer::trace::ReplayOptions o;
        o.policy = policy;
        o.slots = slots;
        o.prefetch = prefetch;
        o.confidence = 0.1;
        o.expert_bytes = 1;
        auto s = mer::trace::Replay(*trace, o);
        if (!s.ok()) __builtin_trap();
        if (s->hits > s->lookups || s->misses != s->lookups - s->hits || s->bypassed > s->misses ||
            s->prefetch_issued != s->prefetch_useful + s->prefetch_wasted || (!prefetch && s->prefetch_issued != 0))
          __builtin_trap();
      }
    }
  }
  return 0;
}
