#include "tools/trace/route_replay.h"

#include <gtest/gtest.h>

#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/generation.h"
#include "tests/unit/tools/trace/trace_test_model.h"
#include "tools/trace/trace_writer.h"

namespace mer::trace {
namespace {

const std::vector<int32_t> kPrompt = {1, 2, 3, 4, 5, 6};

class RouteReplayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = testing_support::LoadTraceTestModel("route_replay_model");
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    engine_ = NewEngine();
    ASSERT_NE(engine_, nullptr);
  }

  std::unique_ptr<CpuEngine> NewEngine(int batch = 4) {
    auto engine = model_.NewEngine(batch);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? std::move(*engine) : nullptr;
  }

  TraceGeometry Geometry() const {
    const ModelConfig& c = model_.weights().config();
    return {c.n_layer, c.n_expert, c.n_expert_used, 0};
  }

  // Greedy generation of 6 tokens after kPrompt, recorded (prompt chunks of 4 and 2, 5 decode
  // steps); the generated ids into *ids.
  RoutingTrace Record(std::vector<int32_t>* ids) {
    auto w = TraceWriter::CreateInMemory(Geometry());
    EXPECT_TRUE(w.ok());
    GenerationRequest req;
    req.prompt = kPrompt;
    req.max_new_tokens = 6;
    auto out = RecordGeneration(*engine_, 0, req, **w);
    EXPECT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE((*w)->Finish().ok()) << (*w)->status();
    if (out.ok()) *ids = *out;
    const std::string& bytes = (*w)->bytes();
    auto t = ParseTrace(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : RoutingTrace();
  }

  // The trace with layer `layer` of record `record` routed elsewhere: each token's first expert
  // replaced by the lowest id it did not choose.
  RoutingTrace Changed(const RoutingTrace& t, size_t record, int layer) {
    RoutingTrace out(t.geometry());
    const int k = t.geometry().top_k;
    for (size_t r = 0; r < t.records().size(); ++r) {
      std::vector<int32_t> ids;
      for (int l = 0; l < t.geometry().n_layer; ++l) {
        const auto e = t.Experts(r, l);
        const size_t at = ids.size();
        ids.insert(ids.end(), e.begin(), e.end());
        for (size_t i = at; r == record && l == layer && i < ids.size(); i += k) {
          int32_t free_id = 0;
          while (std::find(ids.begin() + i, ids.begin() + i + k, free_id) != ids.begin() + i + k) ++free_id;
          ids[i] = free_id;
        }
      }
      EXPECT_TRUE(out.AddRecord(t.records()[r].phase, t.records()[r].n_tokens, ids).ok());
    }
    return out;
  }

  // The digests of the same batches without preselected routes (the router's own choice).
  std::vector<uint64_t> FreeDigests(const RoutingTrace& t, const std::vector<int32_t>& generated) {
    const int V = model_.weights().config().n_vocab;
    std::vector<uint64_t> out;
    engine_->ClearSequence(0);
    int32_t pos = 0;
    size_t next_prompt = 0, next_generated = 0;
    for (const RoutingTrace::Record& rec : t.records()) {
      std::vector<BatchToken> batch;
      for (int32_t i = 0; i < rec.n_tokens; ++i) {
        const int32_t token = rec.phase == TracePhase::kPrompt ? kPrompt[next_prompt++] : generated[next_generated++];
        batch.push_back({token, pos++, 0, true});
      }
      std::vector<float> logits(batch.size() * V);
      EXPECT_TRUE(engine_->Forward(batch, logits.data()).ok());
      out.push_back(Fnv1a64(logits.data(), logits.size() * sizeof(float)));
    }
    return out;
  }

  testing_support::TraceTestModel model_;
  std::unique_ptr<CpuEngine> engine_;
};

std::vector<uint64_t> Digests(const std::vector<RouteReplayRecord>& records) {
  std::vector<uint64_t> out;
  for (const RouteReplayRecord& r : records) out.push_back(r.digest);
  return out;
}

// A greedy recording run through a fresh engine with its routes: the same batches, the generated
// ids again, and the logits of a run without routes (the routes are the router's own), bit for bit.
TEST_F(RouteReplayTest, GreedyRecordingRunsAgainBitForBit) {
  std::vector<int32_t> generated;
  const RoutingTrace trace = Record(&generated);
  ASSERT_EQ(trace.records().size(), 7u);  // prompt chunks of 4 and 2, 5 decode steps
  ASSERT_EQ(generated.size(), 6u);
  const std::vector<uint64_t> free = FreeDigests(trace, generated);

  std::unique_ptr<CpuEngine> fresh = NewEngine();
  auto run = ReplayRoutes(*fresh, trace, kPrompt);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->size(), 7u);
  EXPECT_EQ((*run)[0].phase, TracePhase::kPrompt);
  EXPECT_EQ((*run)[0].n_tokens, 4);
  EXPECT_EQ((*run)[1].n_tokens, 2);
  for (size_t r = 1; r < run->size(); ++r) EXPECT_EQ((*run)[r].greedy, generated[r - 1]) << "record " << r;
  EXPECT_EQ(Digests(*run), free);
  // Run again on the same engine: the same digests (the sequence is cleared, the override is
  // cleared after the run: a run without routes still gives the router's logits).
  auto again = ReplayRoutes(*fresh, trace, kPrompt);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Digests(*again), free);
}

// Other experts at one layer of one record change that record's digest and every later one, and
// none before it.
TEST_F(RouteReplayTest, ChangedRoutesChangeTheLogitsFromThatRecordOn) {
  std::vector<int32_t> generated;
  const RoutingTrace trace = Record(&generated);
  ASSERT_EQ(trace.records().size(), 7u);
  auto base = ReplayRoutes(*engine_, trace, kPrompt);
  ASSERT_TRUE(base.ok()) << base.status();
  auto changed = ReplayRoutes(*engine_, Changed(trace, 3, 1), kPrompt);
  ASSERT_TRUE(changed.ok()) << changed.status();
  ASSERT_EQ(changed->size(), base->size());
  for (size_t r = 0; r < base->size(); ++r) {
    if (r < 3)
      EXPECT_EQ((*changed)[r].digest, (*base)[r].digest) << "record " << r;
    else
      EXPECT_NE((*changed)[r].digest, (*base)[r].digest) << "record " << r;
  }
}

TEST_F(RouteReplayTest, RefusesWhatCannotBeRunAsRecorded) {
  std::vector<int32_t> generated;
  const RoutingTrace trace = Record(&generated);
  ASSERT_EQ(trace.records().size(), 7u);
  const auto code = [&](ComputeBackend& e, const RoutingTrace& t, const std::vector<int32_t>& prompt) {
    return ReplayRoutes(e, t, prompt).status().code();
  };
  const absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code(*engine_, trace, {1, 2, 3}), kInvalid);              // prompt shorter than the trace's
  EXPECT_EQ(code(*engine_, trace, {1, 2, 3, 4, 5, 6, 7}), kInvalid);  // longer
  EXPECT_EQ(code(*engine_, trace, {1, 2, 3, 4, 5, 1 << 30}), kInvalid);
  EXPECT_EQ(code(*NewEngine(3), trace, kPrompt), kInvalid);  // a chunk of 4 in batches of 3
  TraceGeometry other = Geometry();
  ++other.n_expert;
  EXPECT_EQ(code(*engine_, RoutingTrace(other), kPrompt), kInvalid);
  RoutingTrace decode_first(Geometry());
  const int k = Geometry().top_k, n_layer = Geometry().n_layer;
  std::vector<int32_t> one(n_layer * k);
  for (size_t i = 0; i < one.size(); ++i) one[i] = static_cast<int32_t>(i % k);
  ASSERT_TRUE(decode_first.AddRecord(TracePhase::kDecode, 1, one).ok());
  EXPECT_EQ(code(*engine_, decode_first, {}), kInvalid);
  // Ids out of the model's range cannot be in a parsed trace of its geometry; a trace of a larger
  // geometry is refused above.

  // A backend that takes the override and never asks for the routes.
  class Deaf final : public ComputeBackend {
   public:
    explicit Deaf(ComputeBackend& e) : e_(e) {}
    const ModelConfig& config() const override { return e_.config(); }
    int max_batch_tokens() const override { return e_.max_batch_tokens(); }
    int max_sequences() const override { return e_.max_sequences(); }
    int max_context_tokens() const override { return e_.max_context_tokens(); }
    absl::Status Forward(absl::Span<const BatchToken> b, float* logits) override { return e_.Forward(b, logits); }
    absl::Status ForwardArgmax(absl::Span<const BatchToken> b, int32_t* ids) override {
      return e_.ForwardArgmax(b, ids);
    }
    void ClearSequence(int s) override { e_.ClearSequence(s); }
    int32_t sequence_length(int s) const override { return e_.sequence_length(s); }
    void set_routing_observer(RoutingObserver* o) override { e_.set_routing_observer(o); }
    absl::Status set_route_override(RouteOverride*) override { return absl::OkStatus(); }
    BackendCounters counters() const override { return e_.counters(); }

   private:
    ComputeBackend& e_;
  } deaf(*engine_);
  EXPECT_EQ(code(deaf, trace, kPrompt), absl::StatusCode::kUnimplemented);

  // After the refusals the engine runs the trace as before.
  auto run = ReplayRoutes(*engine_, trace, kPrompt);
  ASSERT_TRUE(run.ok()) << run.status();
  for (size_t r = 1; r < run->size(); ++r) EXPECT_EQ((*run)[r].greedy, generated[r - 1]) << "record " << r;
}

// The FNV-1a 64 test vectors.
TEST(Fnv1a64, KnownValues) {
  EXPECT_EQ(Fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar", 6), 0x85944171f73967e8ull);
}

}  // namespace
}  // namespace mer::trace
