// The synthetic models the GPU tests run on: the synthesizer's settings they share, and a model
// file with its packed expert store in a directory removed at the end.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "common/gguf/gguf_file.h"
#include "common/model/expert_source.h"
#include "common/model/model_weights.h"
#include "common/model/synth_model.h"
#include "common/store/packer.h"
#include "services/compute/cpu/cpu_engine.h"
#include "tests/gpu/corpus.h"

namespace mer::gpu_test {

inline int Threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// Seed 11, router skew 0.5, every core.
inline SynthOptions TestSynthOptions(const std::string& preset, SynthQuant quant) {
  SynthOptions o;
  o.geometry = *SynthPreset(preset);
  o.quant = quant;
  o.seed = 11;
  o.router_skew = 0.5;
  o.threads = Threads();
  return o;
}

// A GGUF model opened for the CPU reference (or a GPU engine): every expert from the mapping.
struct Model {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<MappedExpertSource> experts;
};

// nullptr, with the reason on stderr at once (stdout is lost if the process dies).
inline std::unique_ptr<Model> LoadModel(const std::string& path) {
  auto file = GgufFile::Open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "open %s: %s\n", path.c_str(), file.status().ToString().c_str());
    return nullptr;
  }
  auto m = std::make_unique<Model>();
  m->file = std::move(*file);
  auto w = ModelWeights::Load(m->file);
  if (!w.ok()) {
    std::fprintf(stderr, "load %s: %s\n", path.c_str(), w.status().ToString().c_str());
    return nullptr;
  }
  m->weights = std::move(*w);
  m->experts = std::make_unique<MappedExpertSource>(*m->weights);
  return m;
}

// A parameterised test's model: a preset, a quantization, the test's name for it.
struct ModelCase {
  std::string preset;
  SynthQuant quant;
  std::string name;
};

struct StoreFiles {
  std::filesystem::path dir;
  std::string gguf, store;
  ~StoreFiles() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// The model (m.gguf) and its store (store/) in a fresh temporary directory named after the test
// and the tag; nullptr, with the reason on stderr at once (stdout is lost if the process dies).
inline std::unique_ptr<StoreFiles> MakeStore(const std::string& test, const std::string& preset, SynthQuant quant,
                                             const std::string& tag) {
  auto f = std::make_unique<StoreFiles>();
  f->dir = std::filesystem::temp_directory_path() / ("mer_" + test + "_" + std::to_string(getpid()) + "_" + tag);
  std::filesystem::create_directories(f->dir);
  f->gguf = (f->dir / "m.gguf").string();
  f->store = (f->dir / "store").string();
  if (const absl::Status s = WriteSynthModel(TestSynthOptions(preset, quant), f->gguf); !s.ok()) {
    std::fprintf(stderr, "%s: synth: %s\n", tag.c_str(), s.ToString().c_str());
    return nullptr;
  }
  PackOptions po;
  po.threads = Threads();
  if (const auto s = PackExpertStore(f->gguf, f->store, po); !s.ok()) {
    std::fprintf(stderr, "%s: pack: %s\n", tag.c_str(), s.status().ToString().c_str());
    return nullptr;
  }
  std::fprintf(stderr, "%s: model and store written\n", tag.c_str());
  return f;
}

// The CPU engine's greedy ids (n_gen per prompt) and teacher-forced logits over prompts: the
// reference the store and IPC tests compare the cuda backend with.
inline absl::StatusOr<Outputs> CpuReference(const Model& m, const std::vector<std::vector<int32_t>>& prompts,
                                            int n_gen) {
  CpuEngineOptions co;
  co.threads = Threads();
  co.max_batch_tokens = 64;
  co.max_context_tokens = 128;
  auto cpu = CpuEngine::Create(*m.weights, *m.experts, co);
  if (!cpu.ok()) return cpu.status();
  return GreedyAndScore(**cpu, prompts, n_gen, nullptr);
}

// The start of the store and IPC tests: the case's model written as a GGUF and an expert store
// (MakeStore), a fixed corpus of n_prompts x prompt_tokens, and the CPU reference's outputs on
// the GGUF (CpuReference, n_gen tokens each). A failure is a fatal gtest failure in the caller
// (check HasFatalFailure()).
struct StoreReference {
  std::unique_ptr<StoreFiles> files;
  std::vector<std::vector<int32_t>> prompts;
  Outputs ref;
};

inline void MakeStoreReference(const std::string& test, const ModelCase& tc, int n_prompts, int prompt_tokens,
                               int n_gen, StoreReference* r) {
  r->files = MakeStore(test, tc.preset, tc.quant, tc.name);
  ASSERT_NE(r->files, nullptr);
  const std::unique_ptr<Model> full = LoadModel(r->files->gguf);  // every expert from the mapping
  ASSERT_NE(full, nullptr);
  r->prompts = Corpus(n_prompts, prompt_tokens, full->weights->config().n_vocab, 424242);
  absl::StatusOr<Outputs> ref = CpuReference(*full, r->prompts, n_gen);
  ASSERT_TRUE(ref.ok()) << ref.status();
  r->ref = std::move(*ref);
  std::fprintf(stderr, "%s: CPU reference done\n", tc.name.c_str());
}

}  // namespace mer::gpu_test
