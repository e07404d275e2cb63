// Helpers shared by the `mer` subcommands: error reporting, opening a model, building the engine.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/flags.h"
#include "common/gguf/gguf_file.h"
#include "common/model/expert_source.h"
#include "common/model/model_weights.h"
#include "common/store/expert_store.h"
#include "common/tokenizer/tokenizer.h"
#include "services/compute/backend.h"
#include "services/compute/backend_factory.h"
#include "services/compute/generation.h"
#include "services/compute/residency_expert_source.h"
#include "tools/mer/commands.h"

namespace mer::cli {

// Prints "mer <command>: <message>" and returns exit status 1 (2 for usage errors).
int Fail(const char* command, const absl::Status& status);

// Prints `help` to stdout and returns true when --help was given.
bool MaybeHelp(const Args& args, const char* help);

// Everything `generate`, `score` and `bench` run on: the mapped file, the validated weights, the
// tokenizer and a CPU engine reading experts from the mapping -- or, with --store and --residency,
// the expert store's dense.gguf (dense weights and tokenizer) and experts served by mer-residency.
struct LoadedModel {
  std::shared_ptr<const GgufFile> file;  // the model, or the store's dense.gguf
  std::unique_ptr<ExpertStore> store;    // with --store
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ExpertSource> experts;
  ResidencyExpertSource* residency = nullptr;  // == experts.get() with --residency
  std::unique_ptr<ComputeBackend> engine;
  int threads = 0;              // CPU threads the engine runs on
  std::string backend = "cpu";  // --backend cpu|cuda
};

// Flags read: --model, or --store and --residency (instance name); --threads, --ctx (KV
// positions), --batch (prompt chunk; default_batch, or 0 for the backend's:
// DefaultPromptChunkTokens); --backend cpu|cuda, and for cuda --vram-expert-budget
// BYTES|PERCENT% (a cap on the expert arena: bytes, or a percentage of all experts) and
// --pin-experts 0|1 (cudaHostRegister the host memory experts are uploaded from: the mapped file,
// or with --residency this process's mapping of the RAM tier; default 1), --vram-prefetch 0|1
// (look-ahead prefetch into VRAM on decode misses, default 1).
absl::StatusOr<LoadedModel> LoadModel(const Flags& flags, int min_context_tokens, int default_batch = 0);

// The common engine flags, for Flags::Parse.
inline const std::vector<std::string> kEngineFlags = {"model",       "store",        "residency", "threads",
                                                      "ctx",         "batch",        "backend",   "vram-expert-budget",
                                                      "pin-experts", "vram-prefetch"};

// The prompt of --prompt TEXT (tokenized, BOS first where the vocabulary asks for it) or
// --prompt-tokens 1,2,3 (exactly one of them), every id checked against the vocabulary.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const Flags& f, const Tokenizer& tokenizer);

// A generation request from the flags --prompt/--prompt-tokens (PromptTokens), --max-tokens
// (default 64), --temperature, --top-k, --top-p, --seed, --repetition-penalty and --ignore-eos.
absl::StatusOr<GenerationRequest> GenerationRequestFromFlags(const Flags& f, const Tokenizer& tokenizer);

// One line of progress on stderr for a long step (pack, synth, load): bytes done of the total, the
// rate and the time left, redrawn in place at most 10 times a second when stderr is a terminal;
// nothing otherwise (logs keep their one line per step).
class ProgressLine {
 public:
  ProgressLine(std::string label, uint64_t total_bytes);
  void Update(uint64_t done_bytes);
  void Finish();  // ends the line (a terminal only)

 private:
  const std::string label_;
  const uint64_t total_;
  const bool tty_;
  const absl::Time start_;
  absl::Time last_;
  bool drawn_ = false;
};

// `b` bytes for people: "1.50 GiB", "3.25 MiB", "0.5 KiB".
std::string Bytes(uint64_t b);

// The free bytes of the filesystem that holds `path` (or its nearest existing parent).
absl::StatusOr<uint64_t> FreeDiskBytes(const std::string& path);

// Whether a TCP listener could bind HOST:PORT now (port 0 always can). FailedPrecondition naming
// the address and `flag` when something else listens there.
absl::Status CheckPortFree(const std::string& host_port, const std::string& flag);

}  // namespace mer::cli
