// Generation through mer-residency while its reads fail: the CPU engine reads its experts from an
// in-process daemon whose I/O goes through a FaultInjectingIoEngine (EIO, short reads, slow
// reads, bit flips), with a RAM tier of 10% of the experts so that every step demand-loads. The
// contract: every generation either returns exactly the token ids of the same model run from its
// GGUF, or fails with a clear error (DataLoss / Unavailable naming the expert) -- never other
// tokens, never a hang -- and the daemon keeps running throughout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/gguf/gguf_file.h"
#include "common/model/model_weights.h"
#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/generation.h"
#include "services/compute/residency_expert_source.h"
#include "tests/unit/residency/daemon/daemon_fixture.h"

namespace mer::residency {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

const std::vector<int32_t> kPrompt = {1, 17, 42, 99, 7, 3, 250, 12};
constexpr int kNewTokens = 24;

CpuEngineOptions EngineOptions() {
  CpuEngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 8;
  o.max_context_tokens = 64;
  return o;
}

GenerationRequest Greedy() {
  GenerationRequest r;
  r.prompt = kPrompt;
  r.max_new_tokens = kNewTokens;
  r.sampling.temperature = 0;
  return r;
}

// The ids the model gives when every expert comes straight from its GGUF.
std::vector<int32_t> ReferenceIds(const SynthStore& s) {
  auto file = GgufFile::Open(s.gguf);
  CHECK(file.ok());
  std::shared_ptr<GgufFile> shared = std::move(*file);
  auto weights = ModelWeights::Load(shared);
  CHECK(weights.ok());
  MappedExpertSource experts(**weights);
  auto engine = CpuEngine::Create(**weights, experts, EngineOptions());
  CHECK(engine.ok());
  auto ids = Generate(**engine, 0, Greedy(), {});
  CHECK(ids.ok());
  return *ids;
}

struct Outcome {
  absl::StatusOr<std::vector<int32_t>> ids;
  double seconds = 0;
  ResidencyCounters counters;
  FaultStats faults;
};

// Generates through a daemon serving `s` with a RAM tier of 10% of the experts and `faults`.
Outcome GenerateUnderFaults(const SynthStore& s, const FaultInjectionOptions& faults) {
  auto store = ExpertStore::Open(s.store);
  CHECK(store.ok());
  ResidencyOptions o;
  o.ram_budget_bytes = (*store)->blob_bytes() * (*store)->n_layer() * (*store)->n_expert() / 10;
  o.max_refetches = 2;
  DaemonFixture f(o, {}, /*thread=*/true, faults, s.store);
  auto dense = (*store)->LoadDenseWeights();
  CHECK(dense.ok());
  ResidencyExpertSourceOptions so;
  so.acquire_timeout = absl::Seconds(20);
  auto source = ResidencyExpertSource::Connect(**store, f.name(), so);
  CHECK(source.ok());
  auto engine = CpuEngine::Create(**dense, **source, EngineOptions());
  CHECK(engine.ok());
  Outcome out;
  const auto t0 = std::chrono::steady_clock::now();
  out.ids = Generate(**engine, 0, Greedy(), {});
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine->reset();
  source->reset();
  out.counters = f.Stop();  // CHECKs that the daemon's loop returned OK
  out.faults = f.faults()->fault_stats();
  return out;
}

class GenerationUnderFaults : public ::testing::TestWithParam<SynthQuant> {
 protected:
  const SynthStore& store() { return SynthStoreFor("tiny", GetParam()); }
  const std::vector<int32_t>& want() {
    if (want_.empty()) want_ = ReferenceIds(store());
    return want_;
  }
  // Either the reference ids, or a clear error; and in bounded time.
  void ExpectCorrectOrClearError(const Outcome& o) {
    std::printf(
        "  outcome: %s in %.2f s; faults: %llu errors, %llu short, %llu slow, %llu flips; "
        "daemon: %llu refetches, %llu checksum failures, %llu load failures\n",
        o.ids.ok() ? "the reference ids" : std::string(o.ids.status().ToString()).c_str(), o.seconds,
        (unsigned long long)o.faults.errors, (unsigned long long)o.faults.short_reads,
        (unsigned long long)o.faults.delays, (unsigned long long)o.faults.bit_flips,
        (unsigned long long)o.counters.refetches, (unsigned long long)o.counters.checksum_failures,
        (unsigned long long)o.counters.load_failures);
    EXPECT_LT(o.seconds, 60.0);
    if (o.ids.ok()) {
      EXPECT_EQ(*o.ids, want());
    } else {
      EXPECT_THAT(o.ids.status().code(), AnyOf(absl::StatusCode::kDataLoss, absl::StatusCode::kUnavailable))
          << o.ids.status();
      EXPECT_THAT(std::string(o.ids.status().message()), HasSubstr("expert")) << o.ids.status();
    }
  }
  std::vector<int32_t> want_;
};

TEST_P(GenerationUnderFaults, NoFaultsAtTenPercentMatchesTheGguf) {
  FaultInjectionOptions f;
  f.delay_probability = 0.01;  // a fault engine in the path, practically idle
  f.delay = absl::Microseconds(50);
  const Outcome o = GenerateUnderFaults(store(), f);
  ASSERT_TRUE(o.ids.ok()) << o.ids.status();
  EXPECT_EQ(*o.ids, want());
  EXPECT_GT(o.counters.misses, 0u);
  EXPECT_GT(o.counters.evictions, 0u);  // 10% of the experts: the tier churns
}

TEST_P(GenerationUnderFaults, ShortReadsAreContinued) {
  FaultInjectionOptions f;
  f.short_read_probability = 0.5;
  f.seed = 11;
  const Outcome o = GenerateUnderFaults(store(), f);
  ASSERT_TRUE(o.ids.ok()) << o.ids.status();  // a short read is not an error
  EXPECT_EQ(*o.ids, want());
  EXPECT_GT(o.faults.short_reads, 0u);
}

TEST_P(GenerationUnderFaults, SlowReadsOnlyStall) {
  FaultInjectionOptions f;
  f.delay_probability = 0.3;
  f.delay = absl::Milliseconds(2);
  f.seed = 12;
  const Outcome o = GenerateUnderFaults(store(), f);
  ASSERT_TRUE(o.ids.ok()) << o.ids.status();
  EXPECT_EQ(*o.ids, want());
  EXPECT_GT(o.faults.delays, 0u);
  EXPECT_GT(o.counters.stall_ns_total, 0u);
}

TEST_P(GenerationUnderFaults, TransientEioIsRefetched) {
  FaultInjectionOptions f;
  f.error_probability = 0.1;
  f.seed = 13;
  const Outcome o = GenerateUnderFaults(store(), f);
  ExpectCorrectOrClearError(o);
  EXPECT_GT(o.faults.errors, 0u);
  EXPECT_GT(o.counters.refetches, 0u);
}

TEST_P(GenerationUnderFaults, BitFlipsAreCaughtAndRefetched) {
  FaultInjectionOptions f;
  f.bit_flip_probability = 0.02;  // per chunk read; a blob is several chunks
  f.seed = 14;
  const Outcome o = GenerateUnderFaults(store(), f);
  ExpectCorrectOrClearError(o);
  EXPECT_GT(o.faults.bit_flips, 0u);
  EXPECT_GT(o.counters.checksum_failures, 0u);
}

TEST_P(GenerationUnderFaults, EverythingAtOnce) {
  FaultStats fired;
  for (uint64_t seed : {21, 22, 23}) {
    FaultInjectionOptions f;
    f.seed = seed;
    f.error_probability = 0.05;
    f.short_read_probability = 0.2;
    f.delay_probability = 0.1;
    f.delay = absl::Milliseconds(1);
    f.bit_flip_probability = 0.05;
    const Outcome o = GenerateUnderFaults(store(), f);
    ExpectCorrectOrClearError(o);
    fired.errors += o.faults.errors;
    fired.short_reads += o.faults.short_reads;
    fired.delays += o.faults.delays;
    fired.bit_flips += o.faults.bit_flips;
  }
  // Every kind of fault fired at least once: the runs above met them all.
  EXPECT_GT(fired.errors, 0u);
  EXPECT_GT(fired.short_reads, 0u);
  EXPECT_GT(fired.delays, 0u);
  EXPECT_GT(fired.bit_flips, 0u);
}

TEST_P(GenerationUnderFaults, APersistentlyBadBlobFailsWithDataLossNamingIt) {
  auto s = ExpertStore::Open(store().store);
  ASSERT_TRUE(s.ok());
  // Every read of layer 0 expert 0's blob returns flipped bits.
  FaultInjectionOptions f;
  FaultRule r;
  r.kind = FaultKind::kBitFlip;
  r.offset_begin = (*s)->BlobOffset(0, 0);
  r.offset_end = r.offset_begin + (*s)->blob_bytes();
  f.rules.push_back(r);
  // Route at least once to expert 0 of layer 0: every prompt token's top-k covers a quarter of
  // the 16 experts, so over 8 prompt tokens and 24 steps it is all but certain; if the model
  // never routes there, the ids must simply be right.
  const Outcome o = GenerateUnderFaults(store(), f);
  ExpectCorrectOrClearError(o);
  if (o.ids.ok()) {
    EXPECT_EQ(*o.ids, want());
  } else {
    EXPECT_EQ(o.ids.status().code(), absl::StatusCode::kDataLoss) << o.ids.status();
    EXPECT_THAT(std::string(o.ids.status().message()), HasSubstr("layer 0 expert 0"));
    EXPECT_GT(o.counters.load_failures, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Quant, GenerationUnderFaults, ::testing::Values(SynthQuant::kQ8_0, SynthQuant::kF16),
                         [](const auto& info) {
                           return info.param == SynthQuant::kQ8_0 ? std::string("Q8_0") : "F16";
                         });

}  // namespace
}  // namespace mer::residency
