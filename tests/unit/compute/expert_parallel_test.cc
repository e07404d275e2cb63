// Expert parallelism on the CPU reference: N CpuEngine ranks, one thread each, exchanging through
// InProcessExchangeGroup, give the one-engine logits bit for bit, each acquiring only the experts
// placed on it; a rank that fails fails the whole group's step instead of leaving the others
// waiting.
#include "services/compute/expert_parallel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/model/expert_source.h"
#include "common/model/synth_model.h"
#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/cpu/in_process_exchange.h"
#include "services/compute/expert_parallel_backend.h"
#include "tests/unit/synth_weights.h"

namespace mer {
namespace {

TEST(ExpertPlacement, EveryPairHasOneRunnerWhichHoldsItsExpert) {
  EXPECT_FALSE(ExpertPlacement::Create(0, 0).ok());
  EXPECT_FALSE(ExpertPlacement::Create(2, 2).ok());
  EXPECT_FALSE(ExpertPlacement::Create(2, -1).ok());
  // Two layers' routing of 3 tokens, top-4 of 16 experts; expert 5 of layer 1 replicated.
  const std::vector<int32_t> routing = {1, 5, 9, 13, 5, 2, 3, 4, 0, 5, 6, 7};
  for (int n_ranks : {1, 2, 3, 4}) {
    std::vector<ExpertPlacement> ranks;
    for (int r = 0; r < n_ranks; ++r) {
      ranks.push_back(*ExpertPlacement::Create(n_ranks, r));
      ranks.back().Replicate(1, 5);
    }
    for (int layer = 0; layer < 2; ++layer) {
      for (int expert = 0; expert < 16; ++expert) {
        int holders = 0;
        for (const ExpertPlacement& p : ranks) holders += p.Holds(layer, expert);
        EXPECT_EQ(holders, layer == 1 && expert == 5 ? n_ranks : 1) << layer << " " << expert;
      }
      // Every rank assigns the same runners, and each runner holds its pair's expert.
      std::vector<int64_t> load(n_ranks);
      std::vector<int32_t> want(routing.size());
      ranks[0].AssignRunners(layer, routing, absl::MakeSpan(want), absl::MakeSpan(load));
      for (const ExpertPlacement& p : ranks) {
        std::vector<int32_t> got(routing.size());
        p.AssignRunners(layer, routing, absl::MakeSpan(got), absl::MakeSpan(load));
        EXPECT_EQ(got, want) << n_ranks;
      }
      for (size_t i = 0; i < routing.size(); ++i) {
        ASSERT_TRUE(want[i] >= 0 && want[i] < n_ranks);
        EXPECT_TRUE(ranks[want[i]].Holds(layer, routing[i])) << layer << " pair " << i;
      }
    }
  }
  // 4 ranks, layer 1: experts 1, 9, 13 and 5 -> rank 1 owns 1, 5 (placed once at layer 0), 9 and
  // 13; at layer 1 expert 5's three pairs go to the least loaded ranks, one each, not to rank 1.
  std::vector<ExpertPlacement> four;
  for (int r = 0; r < 4; ++r) {
    four.push_back(*ExpertPlacement::Create(4, r));
    four.back().Replicate(1, 5);
  }
  std::vector<int32_t> runners(routing.size());
  std::vector<int64_t> load4(4);
  four[0].AssignRunners(0, routing, absl::MakeSpan(runners), absl::MakeSpan(load4));
  EXPECT_EQ(runners, (std::vector<int32_t>{1, 1, 1, 1, 1, 2, 3, 0, 0, 1, 2, 3}));
  four[0].AssignRunners(1, routing, absl::MakeSpan(runners), absl::MakeSpan(load4));
  // Placed once: 1, 9, 13 -> 1; 2 -> 2; 3 -> 3; 4, 0 -> 0; 6 -> 2; 7 -> 3: loads 2, 3, 2, 2. The
  // replicated 5s (pairs 1, 4, 9) go to ranks 0, 2, 3.
  EXPECT_EQ(runners, (std::vector<int32_t>{1, 0, 1, 1, 2, 2, 3, 0, 0, 3, 2, 3}));
  EXPECT_EQ(load4, (std::vector<int64_t>{3, 3, 3, 3}));
}

// A rank's share of a layer's experts, counted (the cuda ranks size their arenas by it): the
// experts e mod n_ranks == rank, whatever n_expert is, and none for a rank past the experts.
TEST(ExpertPlacement, OwnedExpertsCountTheRanksShare) {
  for (int n_ranks : {1, 2, 3, 4, 7, 64})
    for (int n_expert : {1, 2, 3, 16, 60, 128, 129})
      for (int r = 0; r < n_ranks; ++r) {
        const ExpertPlacement p = *ExpertPlacement::Create(n_ranks, r);
        int want = 0;
        for (int e = 0; e < n_expert; ++e) want += p.Holds(0, e);
        EXPECT_EQ(p.OwnedExperts(n_expert), want) << n_ranks << " ranks, " << n_expert << " experts, rank " << r;
      }
  EXPECT_EQ(ExpertPlacement::Create(3, 0)->OwnedExperts(128), 43);
  EXPECT_EQ(ExpertPlacement::Create(3, 2)->OwnedExperts(128), 42);
  EXPECT_EQ(ExpertPlacement::Create(4, 3)->OwnedExperts(2), 0);
}

// The weights' experts, recording which experts were acquired and failing from `fail_at_call` on.
class RecordingSource final : public ExpertSource {
 public:
  explicit RecordingSource(const ModelWeights& w) : mapped_(w) {}
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    if (++calls_ == fail_at_call) return absl::UnavailableError("rank's residency is gone");
    for (int32_t e : experts) acquired.insert({layer, e});
    return mapped_.AcquireLayer(layer, experts, out);
  }
  void ReleaseLayer(int layer) override { mapped_.ReleaseLayer(layer); }
  std::optional<ExpertTypes> expert_types(int layer) const override { return mapped_.expert_types(layer); }

  std::set<std::pair<int, int>> acquired;
  int fail_at_call = 0;  // 0: never

 private:
  MappedExpertSource mapped_;
  int calls_ = 0;
};

testing_support::SynthWeights MakeModel() {
  SynthOptions o;
  o.geometry = *SynthPreset("micro");
  o.geometry.n_layer = 3;
  o.geometry.n_expert = 16;
  o.geometry.n_expert_used = 4;
  o.quant = SynthQuant::kQ8_0;
  o.seed = 11;
  o.threads = 2;
  auto m = testing_support::LoadSynthWeights(o, "expert_parallel");
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

std::unique_ptr<CpuEngine> MakeEngine(const ModelWeights& w, ExpertSource& src, const ExpertPlacement* placement,
                                      ExpertExchange* exchange) {
  CpuEngineOptions o;
  o.threads = 1;
  o.max_batch_tokens = 16;
  o.max_sequences = 2;
  o.max_context_tokens = 128;
  o.placement = placement;
  o.exchange = exchange;
  auto e = CpuEngine::Create(w, src, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

// What one engine produces: a prompt's logits (one batch, two sequences interleaved), then greedy
// ids of sequence 0 for `steps` tokens; the statuses of its calls, in order.
struct RankRun {
  std::vector<float> prompt_logits;
  std::vector<int32_t> greedy;
  std::vector<absl::Status> statuses;
};

RankRun Drive(ComputeBackend& e, int steps) {
  RankRun run;
  const std::vector<int32_t> prompt = {5, 17, 250, 3, 99, 42, 42, 7};
  std::vector<BatchToken> batch;
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.push_back({prompt[i], int32_t(i / 2), int32_t(i % 2), true});
  }
  run.prompt_logits.resize(prompt.size() * e.config().n_vocab);
  run.statuses.push_back(e.Forward(batch, run.prompt_logits.data()));
  int32_t token = prompt[6];
  for (int i = 0; i < steps && run.statuses.back().ok(); ++i) {
    const BatchToken b{token, int32_t(prompt.size() / 2 + i), 0, true};
    run.statuses.push_back(e.ForwardArgmax(absl::MakeConstSpan(&b, 1), &token));
    run.greedy.push_back(token);
  }
  return run;
}

// Runs `drive` on every rank of an n-rank group, each on its own thread; `replicated` experts of
// layer 1 are on every rank. Returns each rank's run and source.
struct Group {
  std::vector<RankRun> runs;
  std::vector<std::unique_ptr<RecordingSource>> sources;
};

Group RunGroup(const ModelWeights& w, int n_ranks, const std::vector<int>& replicated, int steps,
               const std::function<void(int rank, RecordingSource&)>& prepare = nullptr) {
  InProcessExchangeGroup exchange(n_ranks);
  Group g;
  std::vector<ExpertPlacement> placements;
  for (int r = 0; r < n_ranks; ++r) {
    placements.push_back(*ExpertPlacement::Create(n_ranks, r));
    for (int e : replicated) placements.back().Replicate(1, e);
    g.sources.push_back(std::make_unique<RecordingSource>(w));
    if (prepare) prepare(r, *g.sources.back());
  }
  g.runs.resize(n_ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < n_ranks; ++r) {
    threads.emplace_back([&, r] {
      auto engine = MakeEngine(w, *g.sources[r], &placements[r], &exchange.rank(r));
      g.runs[r] = Drive(*engine, steps);
    });
  }
  for (std::thread& t : threads) t.join();
  return g;
}

TEST(ExpertParallel, RanksGiveTheOneEngineResultsBitForBit) {
  testing_support::SynthWeights m = MakeModel();
  RecordingSource one_source(*m.weights);
  auto one = MakeEngine(*m.weights, one_source, nullptr, nullptr);
  constexpr int kSteps = 64;
  const RankRun want = Drive(*one, kSteps);
  ASSERT_EQ(want.greedy.size(), size_t(kSteps));
  // Not a model stuck on one token: the ids compared below vary.
  EXPECT_GT(std::set<int32_t>(want.greedy.begin(), want.greedy.end()).size(), 8u);
  for (int n_ranks : {1, 2, 3, 4}) {
    for (const std::vector<int>& replicated : {std::vector<int>{}, std::vector<int>{0, 3, 9}}) {
      const Group g = RunGroup(*m.weights, n_ranks, replicated, kSteps);
      std::set<std::pair<int, int>> acquired_by_all;
      for (int r = 0; r < n_ranks; ++r) {
        const std::string where = "rank " + std::to_string(r) + " of " + std::to_string(n_ranks) + ", " +
                                  std::to_string(replicated.size()) + " replicated";
        for (const absl::Status& s : g.runs[r].statuses) ASSERT_TRUE(s.ok()) << where << ": " << s;
        EXPECT_EQ(std::memcmp(g.runs[r].prompt_logits.data(), want.prompt_logits.data(),
                              want.prompt_logits.size() * sizeof(float)),
                  0)
            << where;
        EXPECT_EQ(g.runs[r].greedy, want.greedy) << where;
        const ExpertPlacement placement = *ExpertPlacement::Create(n_ranks, r);
        for (const auto& [layer, expert] : g.sources[r]->acquired) {
          const bool replica = layer == 1 && std::count(replicated.begin(), replicated.end(), expert) != 0;
          EXPECT_TRUE(replica || placement.Holds(layer, expert)) << where << ": " << layer << "/" << expert;
          acquired_by_all.insert({layer, expert});
        }
      }
      // Together the ranks ran every expert the one engine did.
      EXPECT_EQ(acquired_by_all, one_source.acquired) << n_ranks;
    }
  }
}

TEST(ExpertParallel, ARankThatFailsFailsTheGroupStepNotHangsIt) {
  testing_support::SynthWeights m = MakeModel();
  // Rank 1's source fails on its fifth acquire (in the second step): every rank's step fails with
  // its error, and the group stays failed (as an aborted NCCL communicator does).
  const Group g = RunGroup(*m.weights, 3, {}, 8, [](int rank, RecordingSource& s) {
    if (rank == 1) s.fail_at_call = 5;
  });
  for (int r = 0; r < 3; ++r) {
    const std::vector<absl::Status>& st = g.runs[r].statuses;
    ASSERT_GE(st.size(), 2u) << r;
    EXPECT_TRUE(st[0].ok()) << r << ": " << st[0];
    EXPECT_EQ(st.back().code(), absl::StatusCode::kUnavailable) << r << ": " << st.back();
    EXPECT_NE(st.back().message().find("rank's residency is gone"), std::string::npos) << st.back();
  }
}

TEST(ExpertParallel, EngineNeedsBothPlacementAndExchange) {
  testing_support::SynthWeights m = MakeModel();
  RecordingSource src(*m.weights);
  const ExpertPlacement p = *ExpertPlacement::Create(2, 0);
  InProcessExchangeGroup exchange(2);
  CpuEngineOptions o;
  o.placement = &p;
  EXPECT_EQ(CpuEngine::Create(*m.weights, src, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.placement = nullptr;
  o.exchange = &exchange.rank(0);
  EXPECT_EQ(CpuEngine::Create(*m.weights, src, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InProcessExchange, SumsInRankOrderAndRefusesMismatchedCounts) {
  InProcessExchangeGroup group(3);
  std::vector<std::vector<float>> values = {{1, 0, 0.5f}, {0, 2, 0.25f}, {0, 0, 0.125f}};
  std::vector<absl::Status> statuses(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] { statuses[r] = group.rank(r).SumAcrossRanks(values[r].data(), 3); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(values[r], (std::vector<float>{1, 2, 0.875f})) << r;
  }
  // A rank that sends another length fails the group for every rank.
  threads.clear();
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] { statuses[r] = group.rank(r).SumAcrossRanks(values[r].data(), r == 2 ? 2 : 3); });
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) EXPECT_EQ(statuses[r].code(), absl::StatusCode::kInternal) << r;
  EXPECT_FALSE(group.rank(0).SumAcrossRanks(values[0].data(), 3).ok());
}

// N CpuEngine ranks behind one ExpertParallelBackend, each with its own recording source (declared
// before the backend, which owns the engines that read them).
struct BackendGroup {
  std::vector<std::unique_ptr<RecordingSource>> sources;
  std::unique_ptr<ExpertParallelBackend> backend;
};

BackendGroup MakeBackendGroup(const ModelWeights& w, int n_ranks, HotExpertReplication replication = {}) {
  BackendGroup g;
  ExpertParallelBackend::Group group;
  auto exchange = std::make_unique<InProcessExchangeGroup>(n_ranks);
  std::vector<std::unique_ptr<ComputeBackend>> ranks;
  for (int r = 0; r < n_ranks; ++r) {
    group.placements.push_back(std::make_unique<ExpertPlacement>(*ExpertPlacement::Create(n_ranks, r)));
    g.sources.push_back(std::make_unique<RecordingSource>(w));
    ranks.push_back(MakeEngine(w, *g.sources.back(), group.placements.back().get(), &exchange->rank(r)));
  }
  group.exchange = std::move(exchange);
  auto backend = ExpertParallelBackend::Create(std::move(group), std::move(ranks), replication);
  EXPECT_TRUE(backend.ok()) << backend.status();
  g.backend = std::move(*backend);
  return g;
}

// The ranks behind one backend, driven as one engine is (a batch of two interleaved prompts, then
// greedy steps), give its logits bit for bit and its ids.
TEST(ExpertParallelBackend, RanksBehindOneBackendGiveTheOneEngineResults) {
  testing_support::SynthWeights m = MakeModel();
  RecordingSource one_source(*m.weights);
  auto one = MakeEngine(*m.weights, one_source, nullptr, nullptr);
  constexpr int kSteps = 32;
  const RankRun want = Drive(*one, kSteps);
  for (int n_ranks : {1, 2, 3}) {
    BackendGroup g = MakeBackendGroup(*m.weights, n_ranks);
    const RankRun got = Drive(*g.backend, kSteps);
    for (const absl::Status& s : got.statuses) ASSERT_TRUE(s.ok()) << n_ranks << ": " << s;
    EXPECT_EQ(std::memcmp(got.prompt_logits.data(), want.prompt_logits.data(), want.prompt_logits.size() * 4), 0)
        << n_ranks << " ranks";
    EXPECT_EQ(got.greedy, want.greedy) << n_ranks << " ranks";
    // Each rank acquired only its own experts, and together the ones the one engine did.
    std::set<std::pair<int, int>> acquired_by_all;
    for (int r = 0; r < n_ranks; ++r) {
      for (const auto& [layer, expert] : g.sources[r]->acquired) {
        EXPECT_EQ(expert % n_ranks, r) << layer << "/" << expert;
        acquired_by_all.insert({layer, expert});
      }
    }
    EXPECT_EQ(acquired_by_all, one_source.acquired) << n_ranks;
    EXPECT_EQ(g.backend->counters().tokens, one->counters().tokens) << n_ranks;
    // The pairs split over the ranks add up to the one engine's, each rank having computed some.
    const std::vector<BackendCounters> by_rank = g.backend->rank_counters();
    ASSERT_EQ(by_rank.size(), size_t(n_ranks));
    int64_t pairs = 0;
    for (const BackendCounters& c : by_rank) {
      EXPECT_GT(c.expert_pairs, 0) << n_ranks;
      pairs += c.expert_pairs;
    }
    EXPECT_GT(one->counters().expert_pairs, 0);
    EXPECT_EQ(pairs, one->counters().expert_pairs) << n_ranks;
    EXPECT_EQ(g.backend->counters().expert_pairs, pairs) << n_ranks;
  }
}

// The hot experts of a layer: most pairs first, ties to the lower id, never one not routed to; the
// counts before a choice weigh half at the next.
TEST(HotExpertCounter, ChoosesEachLayersMostUsedAndAges) {
  HotExpertCounter hot(2, 6);
  const std::vector<int32_t> layer0 = {3, 1, 3, 5, 1, 3};  // 3 x3, 1 x2, 5 x1
  hot.Count(0, layer0);
  hot.Count(1, std::vector<int32_t>{4, 2});  // a tie: 2 before 4
  hot.Count(7, std::vector<int32_t>{1});     // out of range: ignored
  using Chosen = std::vector<std::pair<int, int>>;
  EXPECT_EQ(hot.ChooseAndAge(2), (Chosen{{0, 3}, {0, 1}, {1, 2}, {1, 4}}));
  // Aged to 1.5, 1, 0.5 and 0.5, 0.5: two new pairs of expert 5 in layer 0 (2.5) now lead.
  hot.Count(0, std::vector<int32_t>{5, 5});
  EXPECT_EQ(hot.ChooseAndAge(1), (Chosen{{0, 5}, {1, 2}}));
  EXPECT_EQ(hot.ChooseAndAge(0), Chosen{});
  HotExpertCounter idle(1, 4);
  EXPECT_EQ(idle.ChooseAndAge(3), Chosen{});  // nothing routed: nothing replicated
}

// Replicas chosen from the routing served: the ranks still give one engine's results bit for bit,
// the replicated experts run on ranks that do not own them, and the layers' busiest ranks compute
// fewer pairs (the expert part's time) than with experts e mod N alone, on the same steps.
TEST(ExpertParallelBackend, HotReplicasKeepTheResultsAndEvenTheRanksPairs) {
  testing_support::SynthWeights m = MakeModel();
  RecordingSource one_source(*m.weights);
  auto one = MakeEngine(*m.weights, one_source, nullptr, nullptr);
  constexpr int kSteps = 48;
  const RankRun want = Drive(*one, kSteps);
  BackendGroup plain = MakeBackendGroup(*m.weights, 2);
  Drive(*plain.backend, kSteps);
  HotExpertReplication replication;
  replication.per_layer = 4;
  replication.every_calls = 4;
  BackendGroup hot = MakeBackendGroup(*m.weights, 2, replication);
  const RankRun got = Drive(*hot.backend, kSteps);
  for (const absl::Status& s : got.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(got.prompt_logits.data(), want.prompt_logits.data(), want.prompt_logits.size() * 4), 0);
  EXPECT_EQ(got.greedy, want.greedy);
  EXPECT_EQ(hot.backend->replicas(), size_t(4 * m.weights->config().n_layer));
  int foreign = 0;  // acquisitions of an expert another rank owns: a replica at work
  for (int r = 0; r < 2; ++r)
    for (const auto& [layer, expert] : hot.sources[r]->acquired) foreign += expert % 2 != r;
  EXPECT_GT(foreign, 0);
  const BackendCounters with = hot.backend->counters(), without = plain.backend->counters();
  EXPECT_EQ(with.expert_pairs, without.expert_pairs);
  for (const BackendCounters& c : hot.backend->rank_counters())
    EXPECT_EQ(c.busiest_rank_pairs, with.busiest_rank_pairs);  // every rank counts the same
  EXPECT_LT(with.busiest_rank_pairs, without.busiest_rank_pairs);
  std::printf(
      "%lld pairs; the layers' busiest rank's: %lld with e mod 2 (%.2fx one rank), %lld with 4 hot "
      "experts a layer replicated (%.2fx)\n",
      static_cast<long long>(with.expert_pairs), static_cast<long long>(without.busiest_rank_pairs),
      double(without.expert_pairs) / without.busiest_rank_pairs, static_cast<long long>(with.busiest_rank_pairs),
      double(with.expert_pairs) / with.busiest_rank_pairs);
}

// A step that fails on one rank fails the backend's call with that rank's error, on every rank,
// without a hang; the group is reset, so the next steps run and give the one engine's results.
TEST(ExpertParallelBackend, AFailedStepFailsOnceAndTheNextStepsRun) {
  testing_support::SynthWeights m = MakeModel();
  RecordingSource one_source(*m.weights);
  auto one = MakeEngine(*m.weights, one_source, nullptr, nullptr);
  const RankRun want = Drive(*one, 8);
  BackendGroup g = MakeBackendGroup(*m.weights, 3);
  g.sources[1]->fail_at_call = 2;  // rank 1's second acquire: in the prompt's second layer
  const RankRun failed = Drive(*g.backend, 8);
  ASSERT_EQ(failed.statuses.size(), 1u);
  EXPECT_EQ(failed.statuses[0].code(), absl::StatusCode::kUnavailable) << failed.statuses[0];
  for (int s = 0; s < 2; ++s) g.backend->ClearSequence(s);
  const RankRun again = Drive(*g.backend, 8);
  for (const absl::Status& s : again.statuses) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(again.prompt_logits.data(), want.prompt_logits.data(), want.prompt_logits.size() * 4), 0);
  EXPECT_EQ(again.greedy, want.greedy);
}

TEST(ExpertParallelBackend, RefusesRanksThatDoNotMatchTheGroup) {
  testing_support::SynthWeights m = MakeModel();
  RecordingSource src(*m.weights);
  ExpertParallelBackend::Group group;
  auto exchange = std::make_unique<InProcessExchangeGroup>(2);
  group.placements.push_back(std::make_unique<ExpertPlacement>(*ExpertPlacement::Create(2, 0)));
  std::vector<std::unique_ptr<ComputeBackend>> ranks;
  ranks.push_back(MakeEngine(*m.weights, src, group.placements[0].get(), &exchange->rank(0)));
  group.exchange = std::move(exchange);
  EXPECT_EQ(ExpertParallelBackend::Create(std::move(group), std::move(ranks)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mer
