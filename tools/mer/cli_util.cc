#include "tools/mer/cli_util.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "services/compute/cpu/cpu_engine.h"
#include "common/model/model_tokenizer.h"
#if MER_HAVE_CUDA
#include "services/compute/cuda/cuda_engine.h"
#endif

namespace mer::cli {

int Fail(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "mer %s: %s\n", command, std::string(status.message()).c_str());
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

bool MaybeHelp(const Args& args, const char* help) {
  if (std::find(args.begin(), args.end(), "--help") == args.end()) return false;
  std::fputs(help, stdout);
  return true;
}

absl::StatusOr<LoadedModel> LoadModel(const Flags& flags, int min_context_tokens) {
  LoadedModel m;
  std::string path;
  if (flags.Has("store") || flags.Has("residency")) {
    if (flags.Has("model"))
      return absl::InvalidArgumentError("give either --model or --store with --residency");
    ASSIGN_OR_RETURN(const std::string dir, flags.Required("store"));
    ASSIGN_OR_RETURN(const std::string instance, flags.Required("residency"));
    ASSIGN_OR_RETURN(m.store, ExpertStore::Open(dir));
    path = m.store->dense_path();
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
    m.file = std::move(file);
    auto weights = ModelWeights::LoadDense(m.file);
    if (!weights.ok())
      return absl::Status(weights.status().code(), absl::StrCat(path, ": ", weights.status().message()));
    m.weights = std::move(*weights);
    ASSIGN_OR_RETURN(std::unique_ptr<ResidencyExpertSource> source,
                     ResidencyExpertSource::Connect(*m.store, instance));
    m.residency = source.get();
    m.experts = std::move(source);
  } else {
    ASSIGN_OR_RETURN(path, flags.Required("model"));
    ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
    m.file = std::move(file);
    auto weights = ModelWeights::Load(m.file);
    if (!weights.ok())
      return absl::Status(weights.status().code(), absl::StrCat(path, ": ", weights.status().message()));
    m.weights = std::move(*weights);
  }
  auto tokenizer = LoadTokenizer(*m.file);
  if (!tokenizer.ok())
    return absl::Status(tokenizer.status().code(), absl::StrCat(path, ": ", tokenizer.status().message()));
  m.tokenizer = std::make_unique<Tokenizer>(std::move(*tokenizer));
  if (m.experts == nullptr) m.experts = std::make_unique<MappedExpertSource>(*m.weights);

  CpuEngineOptions options;
  ASSIGN_OR_RETURN(const int64_t threads, flags.Int("threads", 0));
  ASSIGN_OR_RETURN(const int64_t batch, flags.Int("batch", 256));
  ASSIGN_OR_RETURN(const int64_t ctx, flags.Int("ctx", std::max(4096, min_context_tokens)));
  if (threads < 0 || threads > 1024) return absl::InvalidArgumentError("--threads must be in [0, 1024]");
  m.backend = flags.String("backend", "cpu");
  if (m.backend == "cuda") {
#if MER_HAVE_CUDA
    CudaEngineOptions co;
    co.max_batch_tokens = static_cast<int>(std::clamp<int64_t>(batch, 1, 4096));
    co.max_context_tokens = static_cast<int>(std::clamp<int64_t>(ctx, 1, 1 << 24));
    if (flags.Has("vram-expert-budget")) {
      const std::string b = flags.String("vram-expert-budget");
      char* end = nullptr;
      const double v = std::strtod(b.c_str(), &end);
      if (end == b.c_str() || v <= 0) return absl::InvalidArgumentError("--vram-expert-budget: BYTES or PERCENT%");
      if (*end == '%') {
        if (v > 100) return absl::InvalidArgumentError("--vram-expert-budget: at most 100%");
        co.vram_expert_budget_fraction = v / 100.0;
      } else if (*end == '\0') {
        co.vram_expert_budget_bytes = static_cast<int64_t>(v);
      } else {
        return absl::InvalidArgumentError("--vram-expert-budget: BYTES or PERCENT%");
      }
    }
    ASSIGN_OR_RETURN(const int64_t pin, flags.Int("pin-experts", 1));
    co.pin_host_experts = pin != 0;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> engine, CudaEngine::Create(*m.weights, *m.experts, co));
    m.engine = std::move(engine);
    return m;
#else
    return absl::UnimplementedError("this mer was built without the cuda backend (MER_CUDA=OFF)");
#endif
  }
  if (m.backend != "cpu") return absl::InvalidArgumentError("--backend must be cpu or cuda");
  options.threads = static_cast<int>(threads);
  options.max_batch_tokens = static_cast<int>(std::clamp<int64_t>(batch, 1, 65536));
  options.max_context_tokens = static_cast<int>(std::clamp<int64_t>(ctx, 1, 1 << 24));
  ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> engine, CpuEngine::Create(*m.weights, *m.experts, options));
  m.threads = engine->options().threads;
  m.engine = std::move(engine);
  return m;
}

BackendCounters ReadBackendCounters(const LoadedModel& m) {
  BackendCounters b;
#if MER_HAVE_CUDA
  if (m.backend != "cuda") return b;
  const CudaEngineStats s = static_cast<const CudaEngine&>(*m.engine).stats();
  b.tokens = s.tokens;
  b.expert_lookups = s.expert_lookups;
  b.expert_misses = s.expert_misses;
  b.upload_bytes = s.expert_upload_bytes;
  b.host_syncs = s.host_syncs;
  b.graph_launches = s.graph_launches;
  b.vram_used_peak_bytes = s.vram_used_peak_bytes;
  b.arena_bytes = s.arena_bytes;
  b.arena_slots = s.arena_slots;
  b.total_experts = s.total_experts;
  b.host_experts_pinned = s.host_experts_pinned;
#endif
  return b;
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const Flags& f, const Tokenizer& tokenizer) {
  if (f.Has("prompt") == f.Has("prompt-tokens"))
    return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-tokens");
  std::vector<int32_t> ids;
  if (f.Has("prompt-tokens")) {
    ASSIGN_OR_RETURN(ids, ParseIdList(f.String("prompt-tokens"), "--prompt-tokens"));
  } else {
    if (tokenizer.add_bos() && tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
    const std::vector<int32_t> text = tokenizer.Encode(f.String("prompt"), /*parse_special=*/true);
    ids.insert(ids.end(), text.begin(), text.end());
  }
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : ids) {
    if (id < 0 || id >= tokenizer.vocab_size())
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", id, " is outside the vocabulary"));
  }
  return ids;
}

absl::StatusOr<GenerationRequest> GenerationRequestFromFlags(const Flags& f, const Tokenizer& tokenizer) {
  GenerationRequest req;
  ASSIGN_OR_RETURN(req.prompt, PromptTokens(f, tokenizer));
  ASSIGN_OR_RETURN(const int64_t max_tokens, f.Int("max-tokens", 64));
  if (max_tokens < 1 || max_tokens > (1 << 24))
    return absl::InvalidArgumentError("--max-tokens must be in [1, 2^24]");
  req.max_new_tokens = static_cast<int32_t>(max_tokens);
  ASSIGN_OR_RETURN(const double temperature, f.Double("temperature", 0.0));
  ASSIGN_OR_RETURN(const int64_t top_k, f.Int("top-k", 0));
  ASSIGN_OR_RETURN(const double top_p, f.Double("top-p", 1.0));
  ASSIGN_OR_RETURN(const int64_t seed, f.Int("seed", 0));
  ASSIGN_OR_RETURN(const double penalty, f.Double("repetition-penalty", 1.0));
  req.sampling = {static_cast<float>(temperature), static_cast<int32_t>(top_k),
                  static_cast<float>(top_p), static_cast<uint64_t>(seed), static_cast<float>(penalty)};
  req.eos_id = f.Has("ignore-eos") ? -1 : tokenizer.eos_id();
  return req;
}

}  // namespace mer::cli
