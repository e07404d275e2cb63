#include "services/compute/daemon/batcher.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/model/expert_source.h"
#include "common/model/synth_model.h"
#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/daemon/compute_metrics.h"
#include "services/compute/generation.h"
#include "tests/unit/synth_weights.h"

namespace mer::compute {
namespace {

using Model = testing_support::SynthWeights;

const Model& MicroModel() {
  static Model* m = [] {
    SynthOptions o;
    o.geometry = *SynthPreset("micro");
    o.seed = 11;
    o.threads = 2;
    auto model = testing_support::LoadSynthWeights(o, "batcher_test");
    EXPECT_TRUE(model.ok()) << model.status();
    return new Model(std::move(*model));
  }();
  return *m;
}

// Fails every AcquireLayer with Unavailable while `fail` is set.
class FlakyExpertSource final : public ExpertSource {
 public:
  explicit FlakyExpertSource(const ModelWeights& w) : mapped_(w) {}
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    if (fail.load()) return absl::UnavailableError("residency is gone");
    if (delay_ms.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    return mapped_.AcquireLayer(layer, experts, out);
  }
  void ReleaseLayer(int layer) override { mapped_.ReleaseLayer(layer); }
  std::atomic<bool> fail{false};
  std::atomic<int> delay_ms{0};  // per layer: keeps sequences running long enough to observe

 private:
  MappedExpertSource mapped_;
};

std::unique_ptr<CpuEngine> Engine(ExpertSource& src, int sequences, int batch_tokens) {
  CpuEngineOptions o;
  o.threads = 1;
  o.max_sequences = sequences;
  o.max_batch_tokens = batch_tokens;
  o.max_context_tokens = 128;
  auto e = CpuEngine::Create(*MicroModel().weights, src, o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

GenerationRequest Request(int i) {
  GenerationRequest r;
  const int len = 1 + (i * 7) % 37;  // 1..37 prompt tokens: several chunks of 16
  for (int k = 0; k < len; ++k) r.prompt.push_back((i * 31 + k * 17) % 300);
  r.max_new_tokens = 3 + i % 9;
  if (i % 4 == 0) r.stop_ids = {276};  // requests 8 and 20 stop early at it, 16 at its last token
  if (i % 5 == 1) {                    // and some sample, which must be reproducible too
    r.sampling.temperature = 0.8f;
    r.sampling.top_k = 20;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = 100 + i;
  }
  return r;
}

std::vector<int32_t> Drain(SequenceStream& s) {
  std::vector<int32_t> out;
  while (!s.Next(absl::Seconds(1), &out)) {
  }
  return out;
}

TEST(BatcherTest, BatchedOutputEqualsSoloOutput) {
  MappedExpertSource src(*MicroModel().weights);
  auto solo_engine = Engine(src, 1, 7);  // another chunk size, too
  constexpr int kRequests = 24;
  std::vector<std::vector<int32_t>> solo(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    auto out = Generate(*solo_engine, 0, Request(i), nullptr);
    ASSERT_TRUE(out.ok()) << out.status();
    solo[i] = *out;
  }
  auto engine = Engine(src, 6, 16);  // fewer slots than requests: they join as others leave
  BatcherOptions bo;
  bo.admission_wait = absl::Seconds(60);
  Batcher batcher(*engine, bo);
  std::vector<std::vector<int32_t>> got(kRequests);
  std::vector<absl::Status> status(kRequests);
  std::vector<FinishReason> reason(kRequests, FinishReason::kNone);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      auto s = batcher.Submit(Request(i));
      if (!s.ok()) {
        status[i] = s.status();
        return;
      }
      got[i] = Drain(**s);
      status[i] = (*s)->status();
      reason[i] = (*s)->finish_reason();
    });
  }
  for (auto& t : threads) t.join();
  int stopped = 0;
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(status[i].ok()) << i << ": " << status[i];
    EXPECT_EQ(got[i], solo[i]) << "request " << i;
    // A stop token ends a sequence (and is its last token) even at max_new_tokens.
    const bool stop = !got[i].empty() && Request(i).IsStop(got[i].back());
    stopped += stop;
    EXPECT_EQ(reason[i], stop ? FinishReason::kStopToken : FinishReason::kLength) << "request " << i;
  }
  EXPECT_GT(stopped, 0);  // both reasons are seen
  EXPECT_EQ(batcher.free_sequences(), 6);
  EXPECT_EQ(batcher.kv_free_tokens(), batcher.kv_budget_tokens());
}

TEST(BatcherTest, FinishReasons) {
  MappedExpertSource src(*MicroModel().weights);
  auto solo_engine = Engine(src, 1, 16);
  GenerationRequest r = Request(3);
  r.max_new_tokens = 6;
  auto solo = Generate(*solo_engine, 0, r, nullptr);
  ASSERT_TRUE(solo.ok());
  auto engine = Engine(src, 2, 16);
  Batcher batcher(*engine, {});
  auto s = batcher.Submit(r);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(Drain(**s), *solo);
  EXPECT_EQ((*s)->finish_reason(), FinishReason::kLength);
  // With the fifth and third solo tokens as stop tokens, generation stops right after emitting
  // the first of them.
  r.stop_ids = {(*solo)[4], (*solo)[2]};
  s = batcher.Submit(r);
  ASSERT_TRUE(s.ok());
  const std::vector<int32_t> out = Drain(**s);
  const auto first = std::find_first_of(solo->begin(), solo->end(), r.stop_ids.begin(), r.stop_ids.end());
  ASSERT_LE(first - solo->begin(), 2);
  EXPECT_EQ(out, std::vector<int32_t>(solo->begin(), first + 1));
  EXPECT_EQ((*s)->finish_reason(), FinishReason::kStopToken);
}

// Logprobs come from the logits (never the backend's argmax path) and do not change the tokens:
// greedy picks the most likely token, so it heads its own alternatives.
TEST(BatcherTest, LogprobsOfGreedyTokens) {
  MappedExpertSource src(*MicroModel().weights);
  auto solo_engine = Engine(src, 1, 16);
  GenerationRequest r = Request(2);
  r.max_new_tokens = 5;
  auto solo = Generate(*solo_engine, 0, r, nullptr);
  ASSERT_TRUE(solo.ok());
  auto engine = Engine(src, 2, 16);
  Batcher batcher(*engine, {});
  r.top_logprobs = 3;
  auto s = batcher.Submit(r);
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> out;
  std::vector<TokenLogprobs> logprobs;
  while (!(*s)->Next(absl::Seconds(1), &out, &logprobs)) {
  }
  EXPECT_EQ(out, *solo);
  ASSERT_EQ(logprobs.size(), out.size());
  for (size_t i = 0; i < out.size(); ++i) {
    const TokenLogprobs& lp = logprobs[i];
    ASSERT_EQ(lp.top_ids.size(), 3u);
    EXPECT_EQ(lp.top_ids[0], out[i]);
    EXPECT_EQ(lp.top_logprobs[0], lp.logprob);
    EXPECT_LT(lp.logprob, 0.0f);
    EXPECT_GE(lp.top_logprobs[0], lp.top_logprobs[1]);
    EXPECT_GE(lp.top_logprobs[1], lp.top_logprobs[2]);
  }
  r.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_EQ(batcher.Submit(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BatcherTest, RejectsBadRequestsNamingTheField) {
  MappedExpertSource src(*MicroModel().weights);
  auto engine = Engine(src, 2, 16);
  Batcher batcher(*engine, {});
  GenerationRequest r = Request(1);
  r.prompt.clear();
  EXPECT_EQ(batcher.Submit(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Request(1);
  r.prompt.push_back(300);
  auto s = batcher.Submit(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt"), absl::string_view::npos) << s;
  r = Request(1);
  r.max_new_tokens = 0;
  s = batcher.Submit(r).status();
  EXPECT_NE(s.message().find("max_new_tokens"), absl::string_view::npos) << s;
  r.max_new_tokens = 129 - static_cast<int>(r.prompt.size()) + 1;  // one position too many
  s = batcher.Submit(r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("context"), absl::string_view::npos) << s;
  r.max_new_tokens = 129 - static_cast<int>(r.prompt.size());  // exactly fits
  EXPECT_TRUE(batcher.Submit(r).ok());
  r = Request(1);
  r.sampling.temperature = -1;
  s = batcher.Submit(r).status();
  EXPECT_NE(s.message().find("temperature"), absl::string_view::npos) << s;
}

TEST(BatcherTest, FullSlotsAndKvBudgetAreResourceExhausted) {
  FlakyExpertSource src(*MicroModel().weights);
  src.delay_ms = 2;
  auto engine = Engine(src, 2, 16);
  BatcherOptions bo;
  bo.admission_wait = absl::Milliseconds(50);
  bo.kv_budget_tokens = 100;
  Batcher batcher(*engine, bo);
  GenerationRequest big = Request(2);
  big.prompt.assign(10, 7);
  big.max_new_tokens = 71;  // 80 positions
  GenerationRequest longer = big;
  longer.max_new_tokens = 120;  // more than the budget itself: never admissible
  EXPECT_EQ(batcher.Submit(longer).status().code(), absl::StatusCode::kInvalidArgument);
  auto a = batcher.Submit(big);
  ASSERT_TRUE(a.ok());
  GenerationRequest small = big;
  small.max_new_tokens = 30;  // 39 positions: a slot is free but the budget is not
  auto b = batcher.Submit(small);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
  // A deadline before the admission wait ends is DeadlineExceeded.
  EXPECT_EQ(batcher.Submit(small, absl::Now() + absl::Milliseconds(5)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  Drain(**a);
  EXPECT_TRUE(batcher.Submit(small).ok());
}

TEST(BatcherTest, CancelFreesTheSlotAndOthersContinue) {
  FlakyExpertSource src(*MicroModel().weights);
  auto solo_engine = Engine(src, 1, 16);
  GenerationRequest keep = Request(7);
  keep.max_new_tokens = 40;
  auto solo = Generate(*solo_engine, 0, keep, nullptr);
  ASSERT_TRUE(solo.ok());
  auto engine = Engine(src, 2, 16);
  BatcherOptions bo;
  bo.admission_wait = absl::Milliseconds(0);
  Batcher batcher(*engine, bo);
  GenerationRequest endless = keep;
  endless.max_new_tokens = 100;
  src.delay_ms = 1;
  auto a = batcher.Submit(endless);
  auto b = batcher.Submit(keep);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<int32_t> some;
  (*a)->Next(absl::Seconds(5), &some);
  ASSERT_FALSE(some.empty());
  (*a)->Cancel();
  src.delay_ms = 0;
  Drain(**a);
  EXPECT_EQ((*a)->status().code(), absl::StatusCode::kCancelled);
  // The slot is free again: with no admission wait at all, a new sequence gets in.
  auto c = batcher.Submit(keep);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Drain(**b), *solo);
  EXPECT_EQ(Drain(**c), *solo);
}

// Passes everything to a backend and counts how the batcher drives it: DecodeGreedy calls and
// the tokens they produced, and the largest batch of a Forward.
class CountingBackend final : public ComputeBackend {
 public:
  explicit CountingBackend(ComputeBackend& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  int max_batch_tokens() const override { return inner_.max_batch_tokens(); }
  int max_sequences() const override { return inner_.max_sequences(); }
  int max_context_tokens() const override { return inner_.max_context_tokens(); }
  absl::Status Forward(absl::Span<const BatchToken> batch, float* logits) override {
    Note(batch);
    return inner_.Forward(batch, logits);
  }
  absl::Status ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) override {
    Note(batch);
    return inner_.ForwardArgmax(batch, ids);
  }
  absl::Status DecodeGreedy(int sequence, int32_t token, int32_t position, int max_steps,
                            const std::function<bool(int32_t)>& on_token) override {
    ++decode_greedy_calls;
    return inner_.DecodeGreedy(sequence, token, position, max_steps, [&](int32_t id) {
      ++decode_greedy_tokens;
      return on_token(id);
    });
  }
  void ClearSequence(int sequence) override { inner_.ClearSequence(sequence); }
  int32_t sequence_length(int sequence) const override { return inner_.sequence_length(sequence); }
  void set_routing_observer(RoutingObserver* observer) override { inner_.set_routing_observer(observer); }
  BackendCounters counters() const override { return inner_.counters(); }

  std::atomic<int> decode_greedy_calls{0}, decode_greedy_tokens{0}, largest_batch_sequences{0};

 private:
  void Note(absl::Span<const BatchToken> batch) {
    std::set<int32_t> seqs;
    for (const BatchToken& b : batch) seqs.insert(b.sequence);
    largest_batch_sequences = std::max<int>(largest_batch_sequences, static_cast<int>(seqs.size()));
  }
  ComputeBackend& inner_;
};

// A lone greedy sequence decodes through DecodeGreedy (which the cuda backend pipelines) with
// the same tokens as the solo run; a second sequence submitted meanwhile makes it hand back to
// the batch loop, and both still get their solo tokens.
TEST(BatcherTest, LoneGreedyDecodeRunsThroughDecodeGreedyAndHandsBackForANewSequence) {
  FlakyExpertSource src(*MicroModel().weights);
  auto solo_engine = Engine(src, 1, 16);
  GenerationRequest lone;
  lone.prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  lone.max_new_tokens = 60;
  GenerationRequest late = Request(3);
  late.sampling = {};  // greedy as well
  auto lone_solo = Generate(*solo_engine, 0, lone, nullptr);
  auto late_solo = Generate(*solo_engine, 0, late, nullptr);
  ASSERT_TRUE(lone_solo.ok() && late_solo.ok());

  auto inner = Engine(src, 2, 16);
  CountingBackend engine(*inner);
  Batcher batcher(engine, {});
  src.delay_ms = 1;  // ~2 ms a token: the late request arrives mid-decode
  auto a = batcher.Submit(lone);
  ASSERT_TRUE(a.ok());
  std::vector<int32_t> got_a;
  while (got_a.size() < 10) (*a)->Next(absl::Seconds(1), &got_a);
  EXPECT_GE(engine.decode_greedy_calls.load(), 1);
  auto b = batcher.Submit(late);
  ASSERT_TRUE(b.ok());
  const std::vector<int32_t> got_b = Drain(**b);
  const std::vector<int32_t> rest = Drain(**a);
  got_a.insert(got_a.end(), rest.begin(), rest.end());
  EXPECT_EQ(got_a, *lone_solo);
  EXPECT_EQ(got_b, *late_solo);
  EXPECT_TRUE((*a)->status().ok()) << (*a)->status();
  EXPECT_EQ(engine.largest_batch_sequences.load(), 2);  // they ran batched after the hand-back
  EXPECT_GE(engine.decode_greedy_tokens.load(), 10);
  EXPECT_LT(engine.decode_greedy_tokens.load(), 60 + static_cast<int>(late_solo->size()));
}

TEST(BatcherTest, BackendFailureFailsTheBatchAndServesAgain) {
  FlakyExpertSource src(*MicroModel().weights);
  auto solo_engine = Engine(src, 1, 16);
  GenerationRequest r = Request(5);
  auto solo = Generate(*solo_engine, 0, r, nullptr);
  ASSERT_TRUE(solo.ok());
  auto engine = Engine(src, 2, 16);
  Batcher batcher(*engine, {});
  src.fail = true;
  auto a = batcher.Submit(r);
  ASSERT_TRUE(a.ok());
  Drain(**a);
  EXPECT_EQ((*a)->status().code(), absl::StatusCode::kUnavailable) << (*a)->status();
  src.fail = false;
  auto b = batcher.Submit(r);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Drain(**b), *solo);
  EXPECT_TRUE((*b)->status().ok());
}

// Records which experts are acquired; fails with DataLoss any acquire that includes `bad`, as
// mer-residency answers for a blob that fails its checksum. While a caller holds `gate`, every
// acquire waits for it: the step thread cannot run ahead of the submitting thread.
class DamagedExpertSource final : public ExpertSource {
 public:
  explicit DamagedExpertSource(const ModelWeights& w) : mapped_(w) {}
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    { std::lock_guard<std::mutex> wait_for_the_gate(gate); }
    for (int32_t e : experts) {
      used.insert({layer, e});
      if (bad == std::make_pair(layer, e)) {
        ++failures;
        return absl::DataLossError(absl::StrCat("blob (layer ", layer, ", expert ", e, ") fails its checksum"));
      }
    }
    return mapped_.AcquireLayer(layer, experts, out);
  }
  void ReleaseLayer(int layer) override { mapped_.ReleaseLayer(layer); }
  std::set<std::pair<int, int>> used;
  std::pair<int, int> bad{-1, -1};
  int failures = 0;
  std::mutex gate;

 private:
  MappedExpertSource mapped_;
};

TEST(BatcherTest, ADamagedExpertFailsOnlyTheSequencesRoutedToIt) {
  DamagedExpertSource src(*MicroModel().weights);
  auto solo_engine = Engine(src, 1, 16);
  constexpr int kRequests = 16;
  std::vector<std::vector<int32_t>> solo(kRequests);
  std::vector<std::set<std::pair<int, int>>> used(kRequests);
  std::map<std::pair<int, int>, int> users;
  for (int i = 0; i < kRequests; ++i) {
    src.used.clear();
    auto out = Generate(*solo_engine, 0, Request(i), nullptr);
    ASSERT_TRUE(out.ok()) << out.status();
    solo[i] = *out;
    used[i] = src.used;
    for (const auto& e : src.used) ++users[e];
  }
  // The expert the fewest requests need (but some do): most requests are innocent bystanders.
  src.bad = std::min_element(users.begin(), users.end(), [](const auto& a, const auto& b) {
              return a.second < b.second;
            })->first;
  int needing = 0;
  for (int i = 0; i < kRequests; ++i) needing += used[i].count(src.bad);
  ASSERT_GT(needing, 0);
  ASSERT_LT(needing, kRequests);

  auto engine = Engine(src, 8, 64);  // the requests share steps
  BatcherOptions bo;
  bo.admission_wait = absl::Seconds(60);
  Batcher batcher(*engine, bo);
  std::vector<std::shared_ptr<SequenceStream>> streams(kRequests);
  std::vector<std::vector<int32_t>> got(kRequests);
  for (int first = 0; first < kRequests; first += 8) {  // 8 slots: two groups of 8 at once
    {
      // The group is submitted before the first step of it is through, so its sequences share
      // steps on any host; a step thread let run would take each request alone on one core.
      std::lock_guard<std::mutex> hold_the_steps(src.gate);
      for (int i = first; i < first + 8; ++i) {
        auto s = batcher.Submit(Request(i));
        ASSERT_TRUE(s.ok()) << s.status();
        streams[i] = *s;
      }
    }
    for (int i = first; i < first + 8; ++i) got[i] = Drain(*streams[i]);
  }
  int failed = 0;
  for (int i = 0; i < kRequests; ++i) {
    const absl::Status st = streams[i]->status();
    if (used[i].count(src.bad) != 0) {
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << i << ": " << st;
      EXPECT_NE(st.message().find("fails its checksum"), absl::string_view::npos) << st;
      ++failed;
    } else {
      EXPECT_TRUE(st.ok()) << "request " << i << " never needed the damaged expert: " << st;
      EXPECT_EQ(got[i], solo[i]) << i;
    }
  }
  EXPECT_EQ(failed, needing);
  EXPECT_GT(src.failures, needing);  // the fault fired, in shared steps and then alone
}

// after_step runs on the step thread: after each step (idle = false) and at idle ticks (true),
// never concurrently with a Forward -- what lets mer-compute read the cuda backend's counters.
TEST(BatcherTest, AfterStepRunsOnTheStepThreadAfterStepsAndWhenIdle) {
  MappedExpertSource src(*MicroModel().weights);
  auto engine = Engine(src, 2, 16);
  std::atomic<int> busy{0}, idle{0};
  std::atomic<bool> wrong_thread{false};
  std::atomic<std::thread::id> step_thread{};
  BatcherOptions bo;
  bo.idle_tick = absl::Milliseconds(5);
  bo.after_step = [&](bool is_idle) {
    std::thread::id expected{};
    if (!step_thread.compare_exchange_strong(expected, std::this_thread::get_id()) &&
        expected != std::this_thread::get_id())
      wrong_thread = true;
    (is_idle ? idle : busy).fetch_add(1);
  };
  Batcher batcher(*engine, bo);
  GenerationRequest r = Request(3);
  auto s = batcher.Submit(r);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Drain(**s).size(), size_t(r.max_new_tokens));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (idle.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_GE(busy.load(), r.max_new_tokens);  // a step per token at least (the prompt may take more)
  EXPECT_GE(idle.load(), 2);
  EXPECT_FALSE(wrong_thread.load());
  EXPECT_NE(step_thread.load(), std::this_thread::get_id());
}

}  // namespace
}  // namespace mer::compute
