#include "tools/trace/routing_trace.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace mer::trace {
namespace {

absl::StatusOr<RoutingTrace> Parse(const std::string& bytes) {
  return ParseTrace(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// 2 layers, 4 experts, top-2: a prompt chunk of 2 tokens, then 2 decode tokens.
RoutingTrace SmallTrace() {
  RoutingTrace t(TraceGeometry{2, 4, 2, 4096});
  EXPECT_TRUE(t.AddRecord(TracePhase::kPrompt, 2, {0, 1, 2, 3, /*layer 1*/ 1, 0, 3, 2}).ok());
  EXPECT_TRUE(t.AddRecord(TracePhase::kDecode, 1, {2, 1, /*layer 1*/ 0, 3}).ok());
  EXPECT_TRUE(t.AddRecord(TracePhase::kDecode, 1, {3, 0, /*layer 1*/ 2, 1}).ok());
  return t;
}

void PutU32(std::string& s, size_t at, uint32_t v) { std::memcpy(&s[at], &v, 4); }  // little-endian host
void PutU64(std::string& s, size_t at, uint64_t v) { std::memcpy(&s[at], &v, 8); }

TEST(RoutingTrace, EncodeParseRoundTrip) {
  const RoutingTrace t = SmallTrace();
  EXPECT_EQ(t.tokens(), 4);
  EXPECT_EQ(t.decode_tokens(), 2);
  EXPECT_EQ(t.prompt_tokens(), 2);
  const std::string bytes = EncodeTrace(t);
  ASSERT_EQ(bytes.size(), 48u + (8 + 2 * 8) + 2 * (8 + 2 * 4));
  EXPECT_EQ(bytes.substr(0, 8), "MERTRACE");
  auto parsed = Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->geometry().n_layer, 2);
  EXPECT_EQ(parsed->geometry().n_expert, 4);
  EXPECT_EQ(parsed->geometry().top_k, 2);
  EXPECT_EQ(parsed->geometry().expert_bytes, 4096);
  ASSERT_EQ(parsed->records().size(), 3u);
  EXPECT_EQ(parsed->records()[0].phase, TracePhase::kPrompt);
  EXPECT_EQ(parsed->records()[0].n_tokens, 2);
  EXPECT_EQ(parsed->records()[2].phase, TracePhase::kDecode);
  for (size_t r = 0; r < 3; ++r)
    for (int l = 0; l < 2; ++l) {
      const auto a = t.Experts(r, l), b = parsed->Experts(r, l);
      EXPECT_EQ(std::vector<uint16_t>(a.begin(), a.end()), std::vector<uint16_t>(b.begin(), b.end()));
    }
  const auto e = parsed->Experts(0, 1);
  EXPECT_EQ(std::vector<uint16_t>(e.begin(), e.end()), (std::vector<uint16_t>{1, 0, 3, 2}));
  EXPECT_EQ(EncodeTrace(*parsed), bytes);
}

TEST(RoutingTrace, EmptyTraceIsValid) {
  RoutingTrace t(TraceGeometry{3, 8, 2, 0});
  auto parsed = Parse(EncodeTrace(t));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->records().size(), 0u);
  EXPECT_EQ(parsed->tokens(), 0);
}

TEST(RoutingTrace, AddRecordValidates) {
  RoutingTrace t(TraceGeometry{2, 4, 2, 0});
  EXPECT_FALSE(t.AddRecord(TracePhase::kDecode, 1, {0, 1, 2}).ok());     // wrong count
  EXPECT_FALSE(t.AddRecord(TracePhase::kDecode, 1, {0, 1, 2, 4}).ok());  // id out of range
  EXPECT_FALSE(t.AddRecord(TracePhase::kDecode, 1, {0, 1, 2, 2}).ok());  // duplicate
  EXPECT_FALSE(t.AddRecord(TracePhase::kDecode, 0, {}).ok());            // no tokens
  EXPECT_FALSE(t.AddRecord(static_cast<TracePhase>(7), 1, {0, 1, 2, 3}).ok());
  EXPECT_TRUE(t.AddRecord(TracePhase::kDecode, 1, {0, 1, 2, 3}).ok());
  // The same id in two tokens of a batch is fine.
  EXPECT_TRUE(t.AddRecord(TracePhase::kPrompt, 2, {0, 1, 0, 1, 2, 3, 2, 3}).ok());
  RoutingTrace bad(TraceGeometry{2, 4, 5, 0});  // top_k > n_expert
  EXPECT_FALSE(bad.AddRecord(TracePhase::kDecode, 1, std::vector<int32_t>(10, 0)).ok());
}

TEST(RoutingTrace, GeometryLimits) {
  EXPECT_TRUE(ValidateTraceGeometry({94, 128, 8, 0}).ok());
  EXPECT_FALSE(ValidateTraceGeometry({0, 128, 8, 0}).ok());
  EXPECT_FALSE(ValidateTraceGeometry({94, 0, 8, 0}).ok());
  EXPECT_FALSE(ValidateTraceGeometry({94, 65537, 8, 0}).ok());
  EXPECT_FALSE(ValidateTraceGeometry({94, 128, 0, 0}).ok());
  EXPECT_FALSE(ValidateTraceGeometry({94, 128, 129, 0}).ok());
  EXPECT_FALSE(ValidateTraceGeometry({94, 128, 8, -1}).ok());
}

TEST(RoutingTrace, ParseRejectsEveryCorruption) {
  const std::string good = EncodeTrace(SmallTrace());
  ASSERT_TRUE(Parse(good).ok());
  const auto rejects = [&](std::string bytes, absl::StatusCode code, const char* what) {
    auto p = Parse(bytes);
    EXPECT_FALSE(p.ok()) << what;
    EXPECT_EQ(p.status().code(), code) << what << ": " << p.status();
  };
  using C = absl::StatusCode;
  rejects("", C::kDataLoss, "empty");
  rejects(good.substr(0, 47), C::kDataLoss, "short header");
  std::string s = good;
  s[0] = 'X';
  rejects(s, C::kInvalidArgument, "magic");
  s = good;
  PutU32(s, 8, 2);
  rejects(s, C::kInvalidArgument, "version");
  s = good;
  PutU32(s, 12, 56);
  rejects(s, C::kInvalidArgument, "header size");
  s = good;
  PutU32(s, 16, 0);
  rejects(s, C::kInvalidArgument, "n_layer 0");
  s = good;
  PutU32(s, 16, 70000);
  rejects(s, C::kInvalidArgument, "n_layer big");
  s = good;
  PutU32(s, 20, 0);
  rejects(s, C::kInvalidArgument, "n_expert 0");
  s = good;
  PutU32(s, 20, 3);
  rejects(s, C::kInvalidArgument, "id >= n_expert");
  s = good;
  PutU32(s, 24, 0);
  rejects(s, C::kInvalidArgument, "top_k 0");
  s = good;
  PutU32(s, 24, 5);
  rejects(s, C::kInvalidArgument, "top_k > n_expert");
  s = good;
  PutU32(s, 28, 1);
  rejects(s, C::kInvalidArgument, "flags");
  s = good;
  PutU64(s, 32, uint64_t{1} << 50);
  rejects(s, C::kInvalidArgument, "expert bytes");
  s = good;
  PutU64(s, 40, 4);
  rejects(s, C::kDataLoss, "one record too many");
  s = good;
  PutU64(s, 40, ~uint64_t{0});
  rejects(s, C::kDataLoss, "absurd record count");
  s = good;
  PutU64(s, 40, 2);
  rejects(s, C::kInvalidArgument, "trailing record");
  rejects(good + "x", C::kInvalidArgument, "trailing byte");
  rejects(good.substr(0, good.size() - 1), C::kDataLoss, "truncated ids");
  rejects(good.substr(0, good.size() - 14), C::kDataLoss, "truncated record header");
  s = good;
  PutU32(s, 48, 0);
  rejects(s, C::kInvalidArgument, "phase 0");
  s = good;
  PutU32(s, 48, 3);
  rejects(s, C::kInvalidArgument, "phase 3");
  s = good;
  PutU32(s, 52, 0);
  rejects(s, C::kInvalidArgument, "zero tokens");
  s = good;
  PutU32(s, 52, 256);
  rejects(s, C::kDataLoss, "more tokens than bytes");
  s = good;
  PutU32(s, 52, 0x7FFFFFFF);
  rejects(s, C::kInvalidArgument, "huge token count");
  s = good;
  s[56] = 9;
  rejects(s, C::kInvalidArgument, "id 9");
  s = good;
  s[56] = 1;
  s[57] = 0;
  rejects(s, C::kInvalidArgument, "duplicate id");
  s = good;
  s[57] = 1;
  rejects(s, C::kInvalidArgument, "id 256");
}

TEST(RoutingTrace, FileRoundTripAndErrors) {
  const std::string path = ::testing::TempDir() + "/routing_trace_test.trace";
  ASSERT_TRUE(WriteTraceFile(SmallTrace(), path).ok());
  auto t = ReadTraceFile(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tokens(), 4);
  EXPECT_EQ(ReadTraceFile(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::resize_file(path, 60);
  auto cut = ReadTraceFile(path);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(cut.status().message().find(path), std::string::npos);
  std::filesystem::remove(path);
}

// MER_TRACE_CORPUS_DIR=tests/fuzz/corpus/routing_trace ./routing_trace_test
//   --gtest_filter='*WriteSeedCorpus*' writes the fuzz seeds.
TEST(RoutingTraceFuzzSeeds, WriteSeedCorpus) {
  const char* dir = std::getenv("MER_TRACE_CORPUS_DIR");
  if (dir == nullptr) GTEST_SKIP() << "set MER_TRACE_CORPUS_DIR to write the fuzz seed corpus";
  const auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << bytes;
  };
  write("small.seed", EncodeTrace(SmallTrace()));
  write("empty.seed", EncodeTrace(RoutingTrace(TraceGeometry{3, 8, 2, 0})));
  RoutingTrace big(TraceGeometry{4, 16, 4, 1 << 20});
  std::vector<int32_t> ids;
  for (int l = 0; l < 4; ++l)
    for (int t = 0; t < 3; ++t)
      for (int j = 0; j < 4; ++j) ids.push_back((l * 5 + t * 3 + j) % 16);
  ASSERT_TRUE(big.AddRecord(TracePhase::kPrompt, 3, ids).ok());
  for (int t = 0; t < 4; ++t) {
    ids.clear();
    for (int l = 0; l < 4; ++l)
      for (int j = 0; j < 4; ++j) ids.push_back((t + l + 4 * j) % 16);
    ASSERT_TRUE(big.AddRecord(TracePhase::kDecode, 1, ids).ok());
  }
  write("prompt_and_decode.seed", EncodeTrace(big));
  std::string cut = EncodeTrace(big);
  write("truncated.seed", cut.substr(0, cut.size() - 5));
}

}  // namespace
}  // namespace mer::trace
