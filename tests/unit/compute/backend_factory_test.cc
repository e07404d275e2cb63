// CreateBackend's checks of the options that only one backend takes: --multi-token-kernels is the
// cuda backend's (refused with the cpu backend, and an unknown choice refused before any device is
// touched), so a typo or a misplaced flag fails at start-up with a message naming it; and what the
// callers ask of the factory before a backend exists.
#include "services/compute/backend_factory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "common/model/expert_source.h"
#include "common/model/model_weights.h"
#include "common/model/synth_model.h"
#include "tests/unit/synth_weights.h"

namespace mer {
namespace {

struct MicroModel {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<MappedExpertSource> experts;
};

MicroModel LoadMicro() {
  SynthOptions o;
  o.geometry = *SynthPreset("micro");
  auto model = testing_support::LoadSynthWeights(o, "backend_factory_test");
  EXPECT_TRUE(model.ok()) << model.status();
  MicroModel m;
  if (!model.ok()) return m;
  m.weights = std::move(model->weights);
  m.experts = std::make_unique<MappedExpertSource>(*m.weights);
  return m;
}

// --expert-ranks: 1 to kMaxExpertRanks, the cpu backend's, a source for every rank above 0; N
// ranks split the threads and answer as one engine does (expert_parallel_test checks the bits).
TEST(BackendFactory, ExpertRanksAreCpuRanksWithASourceEach) {
  MicroModel m = LoadMicro();
  ASSERT_NE(m.weights, nullptr);
  BackendOptions o;
  o.threads = 4;
  o.expert_ranks = 0;
  EXPECT_EQ(CreateBackend(*m.weights, *m.experts, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.expert_ranks = kMaxExpertRanks + 1;
  EXPECT_EQ(CreateBackend(*m.weights, *m.experts, o).status().code(), absl::StatusCode::kInvalidArgument);
  o.expert_ranks = 2;
  EXPECT_EQ(CreateBackend(*m.weights, *m.experts, o).status().code(), absl::StatusCode::kInvalidArgument)
      << "no source for rank 1";
  o.backend = "cuda";
  const absl::Status cuda = CreateBackend(*m.weights, *m.experts, o).status();
  EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument) << cuda;
  EXPECT_NE(cuda.message().find("--expert-ranks above 1 needs --backend cpu"), absl::string_view::npos) << cuda;
  o.backend = "cpu";
  int sources = 0;
  o.rank_experts = [&](int) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    ++sources;
    return std::make_unique<MappedExpertSource>(*m.weights);
  };
  auto created = CreateBackend(*m.weights, *m.experts, o);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(sources, 1);
  EXPECT_EQ(created->threads, 4);  // 2 ranks x 2 threads
  const BatchToken b{1, 0, 0, true};
  int32_t id = -1;
  EXPECT_TRUE(created->engine->ForwardArgmax(absl::MakeConstSpan(&b, 1), &id).ok());
  EXPECT_GE(id, 0);
}

// Hot-expert replicas are the ranks' option: refused with one rank and beyond the layer's experts.
TEST(BackendFactory, HotExpertReplicasNeedRanksAndARange) {
  MicroModel m = LoadMicro();
  ASSERT_NE(m.weights, nullptr);
  BackendOptions o;
  o.threads = 2;
  o.replicate_hot_experts = 2;
  const absl::Status one_rank = CreateBackend(*m.weights, *m.experts, o).status();
  EXPECT_EQ(one_rank.code(), absl::StatusCode::kInvalidArgument) << one_rank;
  EXPECT_NE(one_rank.message().find("--expert-ranks 2 or more"), absl::string_view::npos) << one_rank;
  o.expert_ranks = 2;
  o.rank_experts = [&](int) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    return std::make_unique<MappedExpertSource>(*m.weights);
  };
  EXPECT_TRUE(CreateBackend(*m.weights, *m.experts, o).ok());
  o.replicate_hot_experts = m.weights->config().n_expert + 1;
  EXPECT_EQ(CreateBackend(*m.weights, *m.experts, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BackendFactory, MultiTokenKernelsAreTheCudaBackends) {
  MicroModel m = LoadMicro();
  ASSERT_NE(m.weights, nullptr);
  BackendOptions o;
  o.backend = "cpu";
  o.threads = 1;
  ASSERT_TRUE(CreateBackend(*m.weights, *m.experts, o).ok());
  o.multi_token_kernels = "fast";
  const absl::Status on_cpu = CreateBackend(*m.weights, *m.experts, o).status();
  EXPECT_EQ(on_cpu.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(on_cpu.message().find("--multi-token-kernels needs --backend cuda"), absl::string_view::npos) << on_cpu;

  // cuda builds check the choice before creating the engine; builds without it refuse the backend.
  o.backend = "cuda";
  o.multi_token_kernels = "fastest";
  const absl::Status unknown = CreateBackend(*m.weights, *m.experts, o).status();
  ASSERT_FALSE(unknown.ok());
  if (unknown.code() != absl::StatusCode::kUnimplemented) {
    EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument) << unknown;
    EXPECT_NE(unknown.message().find("unknown multi-token kernels 'fastest'"), absl::string_view::npos) << unknown;
  }
}

// What the callers ask of the factory before a backend exists, instead of comparing names.
TEST(BackendFactory, WhatDiffersByBackendBeforeOneExists) {
  EXPECT_EQ(DefaultPromptChunkTokens("cpu"), kCpuPromptChunkTokens);
  EXPECT_EQ(DefaultPromptChunkTokens("cuda"), 1024);
  EXPECT_FALSE(SharesArenaWithResidency("cpu"));
  EXPECT_TRUE(SharesArenaWithResidency("cuda"));

  unsetenv("CUDA_MODULE_LOADING");
  PrepareProcessFor("cpu", /*device_misses=*/true);
  PrepareProcessFor("cuda", /*device_misses=*/false);
  EXPECT_EQ(std::getenv("CUDA_MODULE_LOADING"), nullptr);
  PrepareProcessFor("cuda", /*device_misses=*/true);
  ASSERT_NE(std::getenv("CUDA_MODULE_LOADING"), nullptr);
  EXPECT_STREQ(std::getenv("CUDA_MODULE_LOADING"), "EAGER");
  unsetenv("CUDA_MODULE_LOADING");
}

}  // namespace
}  // namespace mer
