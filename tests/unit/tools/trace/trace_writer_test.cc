#include "tools/trace/trace_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/model/model_weights.h"
#include "services/compute/generation.h"
#include "tests/unit/tools/trace/trace_test_model.h"

namespace mer::trace {
namespace {

absl::StatusOr<RoutingTrace> Parse(const std::string& bytes) {
  return ParseTrace(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

std::vector<uint16_t> Ids(const RoutingTrace& t, size_t r, int l) {
  const auto s = t.Experts(r, l);
  return {s.begin(), s.end()};
}

TEST(TraceWriter, RecordsBatchesInOrderWithPhases) {
  auto w = TraceWriter::CreateInMemory({2, 4, 2, 100});
  ASSERT_TRUE(w.ok());
  TraceWriter& tw = **w;
  // A prompt chunk of 2 tokens (auto: prompt), a decode step (auto: decode).
  tw.OnRouting(0, {0, 1, 2, 3}, 2);
  tw.OnRouting(1, {3, 2, 1, 0}, 2);
  tw.OnRouting(0, {1, 2}, 2);
  tw.OnRouting(1, {2, 3}, 2);
  // A one-token prompt, marked as such.
  tw.set_phase(TraceWriter::Phase::kPrompt);
  tw.OnRouting(0, {0, 3}, 2);
  tw.OnRouting(1, {0, 1}, 2);
  EXPECT_EQ(tw.records(), 3);
  EXPECT_EQ(tw.tokens(), 4);
  EXPECT_EQ(tw.decode_tokens(), 1);
  ASSERT_TRUE(tw.Finish().ok());
  auto t = Parse(tw.bytes());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->records().size(), 3u);
  EXPECT_EQ(t->geometry().expert_bytes, 100);
  EXPECT_EQ(t->records()[0].phase, TracePhase::kPrompt);
  EXPECT_EQ(t->records()[0].n_tokens, 2);
  EXPECT_EQ(t->records()[1].phase, TracePhase::kDecode);
  EXPECT_EQ(t->records()[2].phase, TracePhase::kPrompt);
  EXPECT_EQ(Ids(*t, 0, 1), (std::vector<uint16_t>{3, 2, 1, 0}));
  EXPECT_EQ(Ids(*t, 1, 0), (std::vector<uint16_t>{1, 2}));
  EXPECT_EQ(Ids(*t, 2, 1), (std::vector<uint16_t>{0, 1}));
}

TEST(TraceWriter, ErrorsAreStickyAndReportedByFinish) {
  const auto fails = [](auto feed, bool at_once = true) {
    auto w = TraceWriter::CreateInMemory({2, 4, 2, 0});
    EXPECT_TRUE(w.ok());
    feed(**w);
    EXPECT_EQ((*w)->status().ok(), !at_once);
    EXPECT_FALSE((*w)->Finish().ok());
  };
  fails([](TraceWriter& w) { w.OnRouting(1, {0, 1}, 2); });     // layer 0 not first
  fails([](TraceWriter& w) { w.OnRouting(0, {0, 1, 2}, 3); });  // k mismatch
  fails([](TraceWriter& w) { w.OnRouting(0, {0, 1, 2}, 2); });  // partial token
  fails([](TraceWriter& w) { w.OnRouting(0, {0, 4}, 2); });     // id out of range
  fails([](TraceWriter& w) { w.OnRouting(0, {1, 1}, 2); });     // duplicate
  fails([](TraceWriter& w) {
    w.OnRouting(0, {0, 1}, 2);
    w.OnRouting(1, {0, 1, 2, 3}, 2);
  });                                                               // tokens differ
  fails([](TraceWriter& w) { w.OnRouting(0, {0, 1}, 2); }, false);  // unfinished batch
  EXPECT_FALSE(TraceWriter::CreateInMemory({0, 4, 2, 0}).ok());
  EXPECT_FALSE(TraceWriter::Create("/nonexistent-dir/x.trace", {2, 4, 2, 0}).ok());
}

TEST(TraceWriter, FileIsReadableOnlyOnceFinished) {
  const std::string path = ::testing::TempDir() + "/trace_writer_test_" + std::to_string(getpid()) + ".trace";
  auto w = TraceWriter::Create(path, {1, 8, 2, 64});
  ASSERT_TRUE(w.ok()) << w.status();
  for (int t = 0; t < 1000; ++t) (*w)->OnRouting(0, {t % 8, (t + 1) % 8}, 2);
  ASSERT_TRUE((*w)->Finish().ok());
  auto trace = ReadTraceFile(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->records().size(), 1000u);
  EXPECT_EQ(trace->decode_tokens(), 1000);
  EXPECT_EQ(Ids(*trace, 999, 0), (std::vector<uint16_t>{7, 0}));

  // Not finished: the header still says 0 records, so the file reads as corrupt.
  {
    auto u = TraceWriter::Create(path, {1, 8, 2, 64});
    ASSERT_TRUE(u.ok());
    for (int t = 0; t < 3; ++t) (*u)->OnRouting(0, {0, 1}, 2);
    // Destroyed without Finish.
  }
  EXPECT_FALSE(ReadTraceFile(path).ok());
  std::filesystem::remove(path);
}

// The writer as the engine's observer (RecordGeneration): a prompt, then decode steps, on a small
// synthetic model.
TEST(TraceWriter, RecordsTheEngine) {
  auto model = testing_support::LoadTraceTestModel("trace_writer_model");
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = model->NewEngine(4);  // the 6-token prompt runs as chunks of 4 and 2
  ASSERT_TRUE(engine.ok()) << engine.status();

  GenerationRequest req;
  req.prompt = {1, 2, 3, 4, 5, 6};
  req.max_new_tokens = 5;
  const auto record = [&]() {
    auto w = TraceWriter::CreateInMemory({3, 8, 2, ExpertBytes(model->weights(), 0)});
    EXPECT_TRUE(w.ok());
    auto out = RecordGeneration(**engine, 0, req, **w);
    EXPECT_TRUE(out.ok()) << out.status();
    // The observer is gone: a generation after it records nothing more.
    const int64_t records = (*w)->records();
    EXPECT_TRUE(Generate(**engine, 0, req, {}).ok());
    EXPECT_EQ((*w)->records(), records);
    EXPECT_TRUE((*w)->Finish().ok()) << (*w)->status();
    return (*w)->bytes();
  };
  const std::string bytes = record();
  auto t = Parse(bytes);
  ASSERT_TRUE(t.ok()) << t.status();
  // Chunks of 4 and 2 prompt tokens, then 4 decode steps (the 5th token is never fed back).
  ASSERT_EQ(t->records().size(), 6u);
  EXPECT_EQ(t->records()[0].phase, TracePhase::kPrompt);
  EXPECT_EQ(t->records()[0].n_tokens, 4);
  EXPECT_EQ(t->records()[1].phase, TracePhase::kPrompt);
  EXPECT_EQ(t->records()[1].n_tokens, 2);
  for (size_t r = 2; r < 6; ++r) {
    EXPECT_EQ(t->records()[r].phase, TracePhase::kDecode);
    EXPECT_EQ(t->records()[r].n_tokens, 1);
  }
  EXPECT_EQ(t->prompt_tokens(), 6);
  EXPECT_EQ(t->decode_tokens(), 4);
  EXPECT_GT(t->geometry().expert_bytes, 0);
  // Deterministic: the same run records the same bytes.
  EXPECT_EQ(record(), bytes);

  // A one-token prompt is a prompt record, though its batch is one token as a decode step's is.
  req.prompt = {7};
  req.max_new_tokens = 2;
  auto one = Parse(record());
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->records().size(), 2u);
  EXPECT_EQ(one->records()[0].phase, TracePhase::kPrompt);
  EXPECT_EQ(one->records()[0].n_tokens, 1);
  EXPECT_EQ(one->records()[1].phase, TracePhase::kDecode);
}

}  // namespace
}  // namespace mer::trace
