// The cuda backend with its experts served by mer-residency, as `mer-compute --backend cuda --store
// DIR --residency NAME` runs it: a synthetic model packed into an expert store, the residency
// daemon in process (ResidencyDaemon on its own thread over a real shared-memory segment) with a
// RAM tier of 10% of the experts, and CudaEngine over the store's dense weights (no expert tensors)
// and a ResidencyExpertSource whose RAM tier is registered for DMA in this process. On a corpus of
// prompts, the greedy ids equal the CPU reference engine's on the GGUF and the teacher-forced
// logits are within the bound of cuda_engine_test, with the VRAM arena holding every expert
// (preloaded through the RAM tier) and 10% of them; every acquire keeps to the source's
// max_experts_per_acquire() (half the RAM slots), a layer is held once at a time, and layers that
// need more experts than that are acquired in several groups.
//
// Time-bounded: every acquire gives up after 20 s (a stuck daemon fails the test instead of
// hanging it) and CTest stops the binary after 300 s (tests/gpu/CMakeLists.txt).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "common/model/synth_model.h"
#include "common/store/expert_store.h"
#include "common/store/packer.h"
#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/cuda/cuda_engine.h"
#include "services/compute/cuda/host_memory.h"
#include "services/compute/generation.h"
#include "services/compute/residency_expert_source.h"
#include "tests/gpu/corpus.h"
#include "tests/gpu/test_models.h"
#include "tests/unit/residency/daemon/daemon_fixture.h"

namespace mer {
namespace {

using gpu_test::GreedyAndScore;
using gpu_test::MakeStore;
using gpu_test::Outputs;
using gpu_test::StoreFiles;

constexpr int kPrompts = 4;
constexpr int kPromptTokens = 12;  // x top-k: a prompt layer routes to more experts than one acquire may pin
constexpr int kGenTokens = 32;
constexpr double kLogitsBound = 1e-3;  // relative L2 per step, as cuda_engine_test
constexpr double kRamFraction = 0.10;

// Forwards to the residency source and checks the engine keeps to the ExpertSource contract: at
// most max_experts_per_acquire() experts per acquire, a layer acquired once between releases, and
// (the engine's own rule) at most two layers held at a time: a demand group and a prefetch.
class CheckedSource final : public ExpertSource {
 public:
  explicit CheckedSource(ExpertSource& inner) : inner_(inner) {}
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    EXPECT_LE(static_cast<int>(experts.size()), inner_.max_experts_per_acquire()) << "layer " << layer;
    EXPECT_EQ(held_.count(layer), 0u) << "layer " << layer << " acquired twice without a release";
    // A layer's last demand group stays held until the next synchronisation, and the look-ahead
    // prefetch of the next layer is acquired before it: two layers at most, so at most one held
    // here (each of at most max_experts_per_acquire(), half the RAM tier).
    EXPECT_LE(held_.size(), 1u) << "two other layers are still held";
    held_.insert(layer);
    ++acquires_;
    if (layer == last_layer_) ++repeats_;  // a layer's misses split into several groups
    last_layer_ = layer;
    return inner_.AcquireLayer(layer, experts, out);
  }
  void ReleaseLayer(int layer) override {
    held_.erase(layer);
    inner_.ReleaseLayer(layer);
  }
  int max_experts_per_acquire() const override { return inner_.max_experts_per_acquire(); }
  std::optional<ExpertTypes> expert_types(int layer) const override { return inner_.expert_types(layer); }

  int acquires() const { return acquires_; }
  int repeats() const { return repeats_; }
  size_t held() const { return held_.size(); }

 private:
  ExpertSource& inner_;
  std::set<int> held_;
  int acquires_ = 0, repeats_ = 0, last_layer_ = -1;
};

using Case = gpu_test::ModelCase;

class CudaFromResidency : public ::testing::TestWithParam<Case> {};

TEST_P(CudaFromResidency, GreedyIdsEqualTheCpuReference) {
  const Case& tc = GetParam();
  // The CPU reference on the GGUF, every expert from the mapping.
  gpu_test::StoreReference sr;
  gpu_test::MakeStoreReference("cuda_store_test", tc, kPrompts, kPromptTokens, kGenTokens, &sr);
  ASSERT_FALSE(HasFatalFailure());
  const StoreFiles* files = sr.files.get();
  const auto& prompts = sr.prompts;
  const Outputs& ref = sr.ref;

  // mer-residency in process, RAM tier 10% of the experts.
  auto store = ExpertStore::Open(files->store);
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t all = uint64_t((*store)->n_layer()) * (*store)->n_expert() * (*store)->blob_bytes();
  residency::ResidencyOptions ro;
  ro.ram_budget_bytes = static_cast<uint64_t>(all * kRamFraction);
  residency::DaemonFixture daemon(ro, {}, /*thread=*/true, {}, files->store);
  auto dense = (*store)->LoadDenseWeights();
  ASSERT_TRUE(dense.ok()) << dense.status();
  ASSERT_EQ((*dense)->layers[0].gate_exps.data, nullptr);  // the store's dense.gguf: no experts
  const int V = (*dense)->config().n_vocab;

  for (double arena : {1.0, 0.1}) {
    ResidencyExpertSourceOptions so;
    so.acquire_timeout = absl::Seconds(20);
    so.reconnect_timeout = absl::Seconds(10);
    so.pin_ram_tier = CudaRegisterHostMemory;
    auto source = ResidencyExpertSource::Connect(daemon.store(), daemon.name(), so);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE((*source)->ram_tier_pinned()) << (*source)->ram_tier_pinning();
    CheckedSource checked(**source);
    ASSERT_LT(checked.max_experts_per_acquire(), (*dense)->config().n_expert);  // groups are needed

    CudaEngineOptions o;
    o.max_batch_tokens = 64;
    o.max_context_tokens = 128;
    o.vram_expert_budget_fraction = arena;
    auto gpu = CudaEngine::Create(**dense, checked, o);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    const Outputs got = GreedyAndScore(**gpu, prompts, kGenTokens, &ref);
    gpu_test::ReferenceComparison cmp;
    gpu_test::CompareWithReference(got, ref, V, kLogitsBound, tc.name + " arena " + std::to_string(arena), &cmp);
    ASSERT_FALSE(HasFatalFailure());
    const int mismatches = cmp.id_mismatches;
    const double worst = cmp.worst_rel_l2;
    const BackendCounters s = (*gpu)->counters();
    std::printf(
        "[%s arena %.0f%% = %lld slots, RAM tier %u slots, %d per acquire] greedy id mismatches %d of %d, "
        "worst forced-logits rel L2 %.3g, misses %lld, acquires %d (%d repeated layers), %s; residency %s\n",
        tc.name.c_str(), arena * 100, (long long)s.arena_slots, daemon.daemon().ram_slots(),
        checked.max_experts_per_acquire(), mismatches, kPrompts * kGenTokens, worst, (long long)s.expert_misses,
        checked.acquires(), checked.repeats(), (*source)->ram_tier_pinning().c_str(), (*source)->FormatStats().c_str());
    EXPECT_EQ(checked.held(), 0u);    // every acquire released by the end of each step
    EXPECT_GT(checked.repeats(), 0);  // some layer needed more than one acquire
    if (arena < 1.0) {
      EXPECT_GT(s.expert_misses, 0);  // the miss path was exercised
    } else {
      EXPECT_EQ(s.arena_slots, s.total_experts);
      EXPECT_EQ(s.expert_misses, 0);  // all preloaded through the RAM tier
    }
  }
  const residency::ResidencyCounters c = daemon.Stop();
  EXPECT_EQ(c.checksum_failures, 0u);
  EXPECT_GT(c.evictions, 0u);  // the RAM tier really was smaller than the model
}

INSTANTIATE_TEST_SUITE_P(Store, CudaFromResidency,
                         ::testing::Values(Case{"tiny", SynthQuant::kQ8_0, "tiny_q8_0"},
                                           Case{"tiny", SynthQuant::kF16, "tiny_f16"},
                                           Case{"small", SynthQuant::kQ8_0, "small_q8_0"}),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The store's dense weights and a source that cannot say its experts' types: refused at Create,
// not at the first miss.
class UntypedSource final : public ExpertSource {
 public:
  absl::Status AcquireLayer(int, absl::Span<const int32_t>, absl::Span<ExpertWeights>) override {
    return absl::InternalError("not called");
  }
  void ReleaseLayer(int) override {}
};

TEST(CudaFromStore, NeedsTheExpertTypes) {
  const std::unique_ptr<StoreFiles> files = MakeStore("cuda_store_test", "micro", SynthQuant::kQ8_0, "untyped");
  ASSERT_NE(files, nullptr);
  auto store = ExpertStore::Open(files->store);
  ASSERT_TRUE(store.ok()) << store.status();
  auto dense = (*store)->LoadDenseWeights();
  ASSERT_TRUE(dense.ok()) << dense.status();
  UntypedSource untyped;
  CudaEngineOptions o;
  o.max_context_tokens = 64;
  auto gpu = CudaEngine::Create(**dense, untyped, o);
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition) << gpu.status();
}

}  // namespace
}  // namespace mer
