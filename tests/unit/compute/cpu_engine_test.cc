#include "services/compute/cpu/cpu_engine.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "common/gguf/gguf_writer.h"
#include "common/model/synth_model.h"
#include "services/compute/generation.h"
#include "services/compute/sampler.h"
#include "tests/unit/compute/recorded_routes.h"
#include "tests/unit/compute/reference_forward.h"
#include "tests/unit/compute/type_mix_models.h"
#include "tests/unit/synth_weights.h"

namespace mer {
namespace {

using TestModel = testing_support::SynthWeights;

TestModel MakeModel(SynthOptions o, const std::string& tag) {
  o.threads = 2;
  auto m = testing_support::LoadSynthWeights(o, "engine_test_" + tag);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

SynthOptions SmallGeometry(SynthQuant quant) {
  SynthOptions o;
  o.geometry = *SynthPreset("micro");
  o.quant = quant;
  o.seed = 7;
  return o;
}

std::unique_ptr<CpuEngine> MakeEngine(const ModelWeights& w, ExpertSource& src, int threads, int batch = 64,
                                      int sequences = 2) {
  CpuEngineOptions o;
  o.threads = threads;
  o.max_batch_tokens = batch;
  o.max_sequences = sequences;
  o.max_context_tokens = 256;
  auto e = CpuEngine::Create(w, src, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

const std::vector<int32_t> kTokens = {5, 17, 250, 3, 99, 42, 42, 7, 1, 120, 64, 8};

// kTokens as one batch of `sequence` from position 0; every `logits_every`-th token (from the
// first) asks for its logits row.
std::vector<BatchToken> PromptBatch(int32_t sequence, size_t logits_every = 1) {
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < kTokens.size(); ++i)
    batch.push_back({kTokens[i], int32_t(i), sequence, i % logits_every == 0});
  return batch;
}

// All logits of one sequence fed one token per Forward call.
std::vector<std::vector<float>> StepByStep(CpuEngine& e, int seq, const std::vector<int32_t>& tokens) {
  const int V = e.config().n_vocab;
  std::vector<std::vector<float>> out;
  e.ClearSequence(seq);
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::vector<float> logits(V);
    const BatchToken b{tokens[i], static_cast<int32_t>(i), seq, true};
    EXPECT_TRUE(e.Forward(absl::MakeConstSpan(&b, 1), logits.data()).ok());
    out.push_back(logits);
  }
  return out;
}

// Max |engine - double reference| over the logits of every position of kTokens is below `bound`.
void ExpectCloseToReference(CpuEngine& engine, const ModelWeights& w, double bound) {
  const auto got = StepByStep(engine, 0, kTokens);
  const auto want = testing::ReferenceForward(w, kTokens);
  for (size_t t = 0; t < kTokens.size(); ++t) {
    double max_diff = 0;
    for (size_t i = 0; i < want[t].size(); ++i) max_diff = std::max(max_diff, std::abs(got[t][i] - want[t][i]));
    EXPECT_LT(max_diff, bound) << "position " << t;
  }
}

struct ReferenceCase {
  const char* name;
  int experts_used;
  bool norm_topk;
};

class EngineVsReference : public ::testing::TestWithParam<ReferenceCase> {};

// The engine on an f32 model computes in f32 what the reference computes in double: they agree
// to f32 rounding. With norm_topk_prob off this is the only check (llama.cpp always renormalises).
TEST_P(EngineVsReference, F32LogitsMatchDoubleReference) {
  SynthOptions o = SmallGeometry(SynthQuant::kF32);
  o.geometry.n_expert_used = GetParam().experts_used;
  o.norm_topk_prob = GetParam().norm_topk;
  TestModel m = MakeModel(o, GetParam().name);
  ASSERT_EQ(m.weights->config().norm_topk_prob, GetParam().norm_topk);
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 2);
  ExpectCloseToReference(*engine, *m.weights, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Routing, EngineVsReference,
                         ::testing::Values(ReferenceCase{"top1_norm", 1, true}, ReferenceCase{"top2_norm", 2, true},
                                           ReferenceCase{"top2_raw", 2, false}, ReferenceCase{"top8_raw", 8, false}),
                         [](const auto& info) { return std::string(info.param.name); });

// Quantized weights: the engine rounds activations as llama.cpp does, so it is close to, not
// equal to, the double reference of the same (dequantized) weights.
TEST(CpuEngine, Q8_0CloseToDoubleReference) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "q8");
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 2);
  ExpectCloseToReference(*engine, *m.weights, 0.1);
}

// Any per-tensor mix of types: every matrix of a model in a type of its own, gate, up and down of
// a layer in types with different activation formats (Q8_0, Q8_K, Q8_1), the layers differing.
// The engine is close to the double reference of the same weights (the activations' roundings
// apart, within `tolerance`), and a batch gives the logits of token-by-token decoding bit for bit.
void ExpectMixOfTypesRuns(const std::map<std::string, GgmlType>& types, double tolerance) {
  SynthOptions o;
  o.geometry = test::TypeMixGeometry();
  o.seed = 11;
  o.quant = SynthQuant::kF32;
  o.tensor_types = types;
  auto m = testing_support::LoadSynthWeights(o, "engine_test_mix");
  ASSERT_TRUE(m.ok()) << m.status();
  for (const auto& [name, type] : types) ASSERT_EQ(m->file->FindTensor(name)->type, type) << name;

  MappedExpertSource src(*m->weights);
  auto engine = MakeEngine(*m->weights, src, 2);
  ExpectCloseToReference(*engine, *m->weights, tolerance);
  const auto steps = StepByStep(*engine, 0, kTokens);
  const int V = engine->config().n_vocab;
  std::vector<float> logits(kTokens.size() * V);
  ASSERT_TRUE(engine->Forward(PromptBatch(1), logits.data()).ok());
  for (size_t t = 0; t < kTokens.size(); ++t)
    for (int i = 0; i < V; ++i) ASSERT_EQ(logits[t * V + i], steps[t][i]) << t << " " << i;
}

TEST(CpuEngine, AnyPerTensorMixOfTypes) {
  ExpectMixOfTypesRuns(
      {
          {"token_embd.weight", GgmlType::kQ5_1},
          {"output.weight", GgmlType::kQ4_K},
          {"blk.0.attn_q.weight", GgmlType::kQ2_K},
          {"blk.0.attn_k.weight", GgmlType::kQ3_K},
          {"blk.0.attn_v.weight", GgmlType::kQ6_K},
          {"blk.0.attn_output.weight", GgmlType::kQ4_0},
          {"blk.0.ffn_gate_exps.weight", GgmlType::kQ4_0},
          {"blk.0.ffn_up_exps.weight", GgmlType::kQ5_K},
          {"blk.0.ffn_down_exps.weight", GgmlType::kQ4_1},
          {"blk.1.attn_q.weight", GgmlType::kQ5_1},
          {"blk.1.attn_k.weight", GgmlType::kQ8_0},
          {"blk.1.attn_v.weight", GgmlType::kQ4_K},
          {"blk.1.attn_output.weight", GgmlType::kQ5_0},
          {"blk.1.ffn_gate_exps.weight", GgmlType::kIQ2_XXS},
          {"blk.1.ffn_up_exps.weight", GgmlType::kIQ4_NL},
          {"blk.1.ffn_down_exps.weight", GgmlType::kIQ3_XXS},
      },
      0.15);  // measured 0.083
}

// The same with IQ3_S, IQ2_S and IQ1_S in every role (test::SGridTypeMix).
TEST(CpuEngine, PerTensorMixOfTheSGridTypes) {
  ExpectMixOfTypesRuns(test::SGridTypeMix(), 0.15);  // measured 0.089
}

// A prompt in one batch, in chunks, or token by token gives the same logits bit for bit: each
// (row, token) dot product is computed the same way whatever the batch.
TEST(CpuEngine, BatchedPromptEqualsStepByStep) {
  for (SynthQuant q : {SynthQuant::kF32, SynthQuant::kQ8_0, SynthQuant::kF16}) {
    TestModel m = MakeModel(SmallGeometry(q), "batch");
    MappedExpertSource src(*m.weights);
    auto engine = MakeEngine(*m.weights, src, 2);
    const auto steps = StepByStep(*engine, 0, kTokens);
    const int V = engine->config().n_vocab;
    const std::vector<BatchToken> batch = PromptBatch(1);
    std::vector<float> logits(kTokens.size() * V);
    ASSERT_TRUE(engine->Forward(batch, logits.data()).ok());
    for (size_t t = 0; t < kTokens.size(); ++t)
      for (int i = 0; i < V; ++i) ASSERT_EQ(logits[t * V + i], steps[t][i]) << t << " " << i;
  }
}

// Preselected routes: the router's own choice, given back, gives the same logits bit for bit;
// other experts give other logits; ids out of range fail the step, and the engine goes on.
TEST(CpuEngine, PreselectedRoutes) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "routes");
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 2);
  const int V = engine->config().n_vocab;
  const std::vector<BatchToken> batch = PromptBatch(1);
  test::RecordedRoutes routes;
  engine->set_routing_observer(&routes);
  std::vector<float> free_run(kTokens.size() * V), given(kTokens.size() * V), other(kTokens.size() * V);
  ASSERT_TRUE(engine->Forward(batch, free_run.data()).ok());
  ASSERT_EQ(routes.steps(), 1u);
  routes.recording = false;
  ASSERT_TRUE(engine->set_route_override(&routes).ok());
  engine->ClearSequence(0);
  ASSERT_TRUE(engine->Forward(batch, given.data()).ok());
  EXPECT_EQ(routes.given_steps(), 1u);
  EXPECT_EQ(std::memcmp(free_run.data(), given.data(), given.size() * sizeof(float)), 0);

  for (auto mode : {test::RecordedRoutes::Given::kShifted, test::RecordedRoutes::Given::kShiftedWeighted}) {
    routes.given = mode;
    routes.Rewind();
    engine->ClearSequence(0);
    ASSERT_TRUE(engine->Forward(batch, other.data()).ok());
    EXPECT_NE(std::memcmp(free_run.data(), other.data(), other.size() * sizeof(float)), 0);
  }

  // Ids out of range, or one id twice in a token's route (layer 1's only), fail the step.
  class Bad final : public RouteOverride {
   public:
    explicit Bad(int32_t id) : id_(id) {}
    bool Route(int layer, int n, int k, int32_t* ids, float*, bool* has_weights) override {
      for (int i = 0; i < n * k; ++i) ids[i] = id_ >= 0 || layer != 1 ? std::abs(id_) + i % k : 0;
      *has_weights = false;
      return true;
    }

   private:
    int32_t id_;
  };
  Bad out_of_range(1000000), repeated(-1);
  for (Bad* bad : {&out_of_range, &repeated}) {
    ASSERT_TRUE(engine->set_route_override(bad).ok());
    engine->ClearSequence(0);
    const absl::Status s = engine->Forward(batch, other.data());
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_EQ(engine->sequence_length(0), 0);
  }
  // Given weights are used as they are: zeros leave the experts out; a NaN fails the step.
  class Weighted final : public RouteOverride {
   public:
    explicit Weighted(float w) : w_(w) {}
    bool Route(int, int n, int k, int32_t* ids, float* weights, bool* has_weights) override {
      for (int i = 0; i < n * k; ++i) {
        ids[i] = i % k;
        weights[i] = w_;
      }
      *has_weights = true;
      return true;
    }

   private:
    float w_;
  };
  Weighted zero(0.0f), nan(std::nanf(""));
  ASSERT_TRUE(engine->set_route_override(&zero).ok());
  engine->ClearSequence(0);
  ASSERT_TRUE(engine->Forward(batch, other.data()).ok());
  EXPECT_NE(std::memcmp(free_run.data(), other.data(), other.size() * sizeof(float)), 0);
  ASSERT_TRUE(engine->set_route_override(&nan).ok());
  engine->ClearSequence(0);
  EXPECT_TRUE(absl::IsInvalidArgument(engine->Forward(batch, other.data())));
  ASSERT_TRUE(engine->set_route_override(nullptr).ok());
  engine->ClearSequence(0);
  ASSERT_TRUE(engine->Forward(batch, other.data()).ok());
  EXPECT_EQ(std::memcmp(free_run.data(), other.data(), other.size() * sizeof(float)), 0);
}

// ForwardArgmax gives each logits row's Sampler::Argmax, rows in batch order (every third token
// of the prompt asks for its row).
TEST(CpuEngine, ForwardArgmaxIsTheArgmaxOfEachRow) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "argmax");
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 2);
  const int V = engine->config().n_vocab;
  const std::vector<BatchToken> batch = PromptBatch(0, 3);
  const int rows = static_cast<int>((kTokens.size() + 2) / 3);
  std::vector<float> logits(rows * V);
  ASSERT_TRUE(engine->Forward(batch, logits.data()).ok());
  engine->ClearSequence(0);
  std::vector<int32_t> ids(rows, -1);
  ASSERT_TRUE(engine->ForwardArgmax(batch, ids.data()).ok());
  for (int r = 0; r < rows; ++r)
    EXPECT_EQ(ids[r], Sampler::Argmax(absl::MakeConstSpan(logits.data() + r * V, V))) << "row " << r;
  // The same errors as Forward.
  const BatchToken bad{V, 0, 0, true};
  EXPECT_EQ(engine->ForwardArgmax(absl::MakeConstSpan(&bad, 1), ids.data()).code(), absl::StatusCode::kInvalidArgument);
}

// An ExpertSource that allows only `limit` experts per acquire (a RAM tier smaller than a layer),
// and checks that the engine keeps to it and releases each group before acquiring the next.
class GroupLimitedSource final : public ExpertSource {
 public:
  GroupLimitedSource(const ModelWeights& w, int limit) : inner_(w), limit_(limit) {}
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    EXPECT_LE(static_cast<int>(experts.size()), limit_);
    EXPECT_EQ(held_, -1) << "layer " << held_ << " still held";
    held_ = layer;
    ++acquires_;
    return inner_.AcquireLayer(layer, experts, out);
  }
  void ReleaseLayer(int layer) override { held_ = -1; }
  int max_experts_per_acquire() const override { return limit_; }
  int acquires() const { return acquires_; }

 private:
  MappedExpertSource inner_;
  int limit_;
  int held_ = -1;
  int acquires_ = 0;
};

// A source that hands out its experts in groups gives the same logits bit for bit.
TEST(CpuEngine, ExpertGroupsOfAnySizeGiveTheSameLogits) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "groups");
  MappedExpertSource all(*m.weights);
  auto reference = MakeEngine(*m.weights, all, 2);
  const int V = reference->config().n_vocab;
  const std::vector<BatchToken> batch = PromptBatch(0);
  std::vector<float> want(kTokens.size() * V);
  ASSERT_TRUE(reference->Forward(batch, want.data()).ok());
  for (int limit : {1, 2, 3, 7}) {
    GroupLimitedSource limited(*m.weights, limit);
    auto engine = MakeEngine(*m.weights, limited, 2);
    std::vector<float> got(kTokens.size() * V);
    ASSERT_TRUE(engine->Forward(batch, got.data()).ok());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << limit;
    // 12 tokens x top-2 of 8 experts reach most experts: more than one group per layer.
    EXPECT_GT(limited.acquires(), m.weights->config().n_layer) << limit;
  }
}

// Two sequences interleaved in one batch (continuous batching) each get what they get alone.
TEST(CpuEngine, InterleavedSequencesMatchSolo) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "interleave");
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 2);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> b = {200, 100, 50, 25, 12, 6};
  const auto solo_a = StepByStep(*engine, 0, a);
  const auto solo_b = StepByStep(*engine, 1, b);
  engine->ClearSequence(0);
  engine->ClearSequence(1);
  const int V = engine->config().n_vocab;
  std::vector<float> logits(2 * V);
  for (size_t i = 0; i < a.size(); ++i) {
    const BatchToken batch[] = {{b[i], int32_t(i), 1, true}, {a[i], int32_t(i), 0, true}};
    ASSERT_TRUE(engine->Forward(batch, logits.data()).ok());
    for (int j = 0; j < V; ++j) {
      ASSERT_EQ(logits[j], solo_b[i][j]);
      ASSERT_EQ(logits[V + j], solo_a[i][j]);
    }
  }
}

TEST(CpuEngine, ThreadCountDoesNotChangeResults) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "threads");
  MappedExpertSource src(*m.weights);
  auto one = MakeEngine(*m.weights, src, 1);
  auto three = MakeEngine(*m.weights, src, 3);
  EXPECT_EQ(StepByStep(*one, 0, kTokens), StepByStep(*three, 0, kTokens));
}

TEST(CpuEngine, RejectsBadBatches) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kF32), "bad");
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 1, /*batch=*/4, /*sequences=*/2);
  std::vector<float> logits(8 * engine->config().n_vocab);
  const auto run = [&](std::vector<BatchToken> b) { return engine->Forward(b, logits.data()); };
  EXPECT_EQ(run({}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run({{300, 0, 0, true}}).code(), absl::StatusCode::kInvalidArgument);  // vocab is 300
  EXPECT_EQ(run({{-1, 0, 0, true}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run({{1, 0, 2, true}}).code(), absl::StatusCode::kInvalidArgument);  // no sequence 2
  EXPECT_EQ(run({{1, 1, 0, true}}).code(), absl::StatusCode::kInvalidArgument);  // skips position 0
  EXPECT_EQ(run({{1, 0, 0, true}, {1, 2, 0, true}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(run({{1, 256, 0, true}}).code(), absl::StatusCode::kInvalidArgument);  // past context
  EXPECT_EQ(run({{1, 0, 0, 1}, {1, 1, 0, 1}, {1, 2, 0, 1}, {1, 3, 0, 1}, {1, 4, 0, 1}}).code(),
            absl::StatusCode::kInvalidArgument);  // more than max_batch_tokens
  EXPECT_TRUE(run({{1, 0, 0, true}}).ok());
  EXPECT_EQ(engine->sequence_length(0), 1);
}

// An expert source that fails once for a layer: the error reaches the caller, the sequence is
// left as before the failed batch, and the next attempt succeeds with the right logits.
class FlakyExpertSource : public ExpertSource {
 public:
  explicit FlakyExpertSource(const ModelWeights& w) : inner_(w) {}
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    if (fail_next_ && layer == 1) {
      fail_next_ = false;
      return absl::UnavailableError("residency is down");
    }
    return inner_.AcquireLayer(layer, experts, out);
  }
  void ReleaseLayer(int layer) override { inner_.ReleaseLayer(layer); }
  bool fail_next_ = true;

 private:
  MappedExpertSource inner_;
};

TEST(CpuEngine, ExpertSourceErrorsPropagateAndRecover) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "flaky");
  FlakyExpertSource flaky(*m.weights);
  MappedExpertSource good(*m.weights);
  auto engine = MakeEngine(*m.weights, flaky, 2);
  auto reference = MakeEngine(*m.weights, good, 2);
  const int V = engine->config().n_vocab;
  std::vector<float> logits(V);
  const BatchToken b{kTokens[0], 0, 0, true};
  EXPECT_EQ(engine->Forward(absl::MakeConstSpan(&b, 1), logits.data()).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine->sequence_length(0), 0);
  EXPECT_EQ(StepByStep(*engine, 0, kTokens), StepByStep(*reference, 0, kTokens));
}

TEST(Generation, GreedyIsDeterministicAndScoreAgrees) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kQ8_0), "gen");
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 2, /*batch=*/5);  // prompt in 3 chunks
  GenerationRequest req;
  req.prompt = kTokens;
  req.max_new_tokens = 20;
  auto first = Generate(*engine, 0, req, {});
  auto second = Generate(*engine, 1, req, {});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(*first, *second);
  ASSERT_EQ(first->size(), 20u);
  // Teacher forcing with the generated tokens reproduces each greedy choice.
  const int V = engine->config().n_vocab;
  std::vector<float> logits(first->size() * V);
  ASSERT_TRUE(Score(*engine, 0, kTokens, *first, logits.data()).ok());
  for (size_t i = 0; i < first->size(); ++i)
    EXPECT_EQ(Sampler::Argmax(absl::MakeConstSpan(&logits[i * V], V)), (*first)[i]) << i;
}

TEST(Generation, RejectsRequestsThatDoNotFit) {
  TestModel m = MakeModel(SmallGeometry(SynthQuant::kF32), "fit");
  MappedExpertSource src(*m.weights);
  auto engine = MakeEngine(*m.weights, src, 1);
  GenerationRequest req;
  req.prompt = kTokens;
  req.max_new_tokens = 256;  // context is 256 positions
  EXPECT_EQ(Generate(*engine, 0, req, {}).status().code(), absl::StatusCode::kInvalidArgument);
  req.prompt.clear();
  req.max_new_tokens = 4;
  EXPECT_EQ(Generate(*engine, 0, req, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mer
