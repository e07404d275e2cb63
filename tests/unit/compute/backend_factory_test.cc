// CreateBackend's checks of the options that only one backend takes: --multi-token-kernels is the
// cuda backend's (refused with the cpu backend, and an unknown choice refused before any device is
// touched), so a typo or a misplaced flag fails at start-up with a message naming it; and what the
// callers ask of the factory before a backend exists.
#include "services/compute/backend_factory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

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

// --expert-ranks: 1 to kMaxExpertRanks, a source for every rank above 0; N cpu ranks split the
// threads and answer as one engine does (expert_parallel_test checks the bits; the cuda ranks'
// bits: cuda_engine_test).
TEST(BackendFactory, ExpertRanksAreRanksWithASourceEach) {
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
  if (cuda.code() != absl::StatusCode::kUnimplemented) {  // a build with the cuda backend
    EXPECT_EQ(cuda.code(), absl::StatusCode::kInvalidArgument) << cuda;
    EXPECT_NE(cuda.message().find("no expert source for the ranks above 0"), absl::string_view::npos) << cuda;
  }
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

// Ranks that share one mer-residency name read from NAME, NAME.rank1, NAME.rank2, ...
TEST(BackendFactory, RankResidencyInstancesFollowTheFirstName) {
  EXPECT_EQ(RankResidencyInstance("mer", 0), "mer");
  EXPECT_EQ(RankResidencyInstance("mer", 1), "mer.rank1");
  EXPECT_EQ(RankResidencyInstance("mer-up-42", 13), "mer-up-42.rank13");
}

// --gpus: CUDA ordinals, comma-separated, one per rank (repeats allowed: ranks that share a GPU);
// the list must fit --expert-ranks and the cuda backend, checked before any device is touched.
TEST(BackendFactory, GpuListIsOnePerCudaRank) {
  EXPECT_EQ(*ParseGpuList("0"), (std::vector<int>{0}));
  EXPECT_EQ(*ParseGpuList("0,1,7"), (std::vector<int>{0, 1, 7}));
  EXPECT_EQ(*ParseGpuList("0,0,1"), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(*ParseGpuList("1023"), (std::vector<int>{kMaxGpuOrdinal}));
  for (const char* bad : {"", ",", "0,", ",1", "0,,1", "-1", "1024", "x", "0;1", "1.5", "99999999999"}) {
    const absl::Status s = ParseGpuList(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_NE(s.message().find("--gpus"), absl::string_view::npos) << s;
  }

  MicroModel m = LoadMicro();
  ASSERT_NE(m.weights, nullptr);
  BackendOptions o;
  o.threads = 2;
  o.rank_experts = [&](int) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    return std::make_unique<MappedExpertSource>(*m.weights);
  };
  o.expert_ranks = 2;
  o.gpus = {0, 1};
  const absl::Status on_cpu = CreateBackend(*m.weights, *m.experts, o).status();
  EXPECT_EQ(on_cpu.code(), absl::StatusCode::kInvalidArgument) << on_cpu;
  EXPECT_NE(on_cpu.message().find("--gpus needs --backend cuda"), absl::string_view::npos) << on_cpu;
  o.backend = "cuda";
  o.gpus = {0};
  const absl::Status short_list = CreateBackend(*m.weights, *m.experts, o).status();
  EXPECT_EQ(short_list.code(), absl::StatusCode::kInvalidArgument) << short_list;
  EXPECT_NE(short_list.message().find("--gpus lists 1 GPU(s) for --expert-ranks 2: one per rank"),
            absl::string_view::npos)
      << short_list;
  o.gpus = {0, 0, 1};
  EXPECT_EQ(CreateBackend(*m.weights, *m.experts, o).status().code(), absl::StatusCode::kInvalidArgument);
  // Replicas are the cpu ranks' only: the cuda ranks' arenas hold their shares.
  o.gpus = {0, 0};
  o.replicate_hot_experts = 1;
  const absl::Status replicas = CreateBackend(*m.weights, *m.experts, o).status();
  EXPECT_EQ(replicas.code(), absl::StatusCode::kUnimplemented) << replicas;
  EXPECT_NE(replicas.message().find("--replicate-hot-experts with --backend cuda"), absl::string_view::npos)
      << replicas;
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
