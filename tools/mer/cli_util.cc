#include "tools/mer/cli_util.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/model/model_tokenizer.h"

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
  ASSIGN_OR_RETURN(const int64_t threads, flags.Int("threads", 0));
  ASSIGN_OR_RETURN(const int64_t batch, flags.Int("batch", 256));
  ASSIGN_OR_RETURN(const int64_t ctx, flags.Int("ctx", std::max(4096, min_context_tokens)));
  ASSIGN_OR_RETURN(const int64_t pin, flags.Int("pin-experts", 1));
  ASSIGN_OR_RETURN(const int64_t vram_prefetch, flags.Int("vram-prefetch", 1));
  ASSIGN_OR_RETURN(const int64_t profile_kernels, flags.Int("profile-kernels", 0));
  ASSIGN_OR_RETURN(const int64_t split_cells, flags.Int("attention-split-cells", -1));
  if (threads < 0 || threads > 1024) return absl::InvalidArgumentError("--threads must be in [0, 1024]");
  BackendOptions o;
  o.backend = m.backend = flags.String("backend", "cpu");
  o.threads = static_cast<int>(threads);
  o.max_batch_tokens = static_cast<int>(std::clamp<int64_t>(batch, 1, 65536));
  o.max_context_tokens = static_cast<int>(std::clamp<int64_t>(ctx, 1, 1 << 24));
  o.vram_expert_budget = flags.String("vram-expert-budget");
  o.pin_host_experts = pin != 0;
  o.vram_prefetch = vram_prefetch != 0;
  o.profile_kernels = profile_kernels != 0;
  if (split_cells >= 0) o.attention_split_min_cells = static_cast<int>(std::min<int64_t>(split_cells, 1 << 24));

  std::string path;
  if (flags.Has("store") || flags.Has("residency")) {
    if (flags.Has("model"))
      return absl::InvalidArgumentError("give either --model or --store with --residency");
    ASSIGN_OR_RETURN(const std::string dir, flags.Required("store"));
    ASSIGN_OR_RETURN(const std::string instance, flags.Required("residency"));
    ASSIGN_OR_RETURN(m.store, ExpertStore::Open(dir));
    path = m.store->dense_path();
    ASSIGN_OR_RETURN(m.weights, m.store->LoadDenseWeights());  // checks every byte of dense.gguf
    m.file = m.weights->shared_file();
    ResidencyExpertSourceOptions so;
    so.pin_ram_tier = HostMemoryPinnerFor(o);  // cuda: register the RAM tier in this process
    ASSIGN_OR_RETURN(std::unique_ptr<ResidencyExpertSource> source,
                     ResidencyExpertSource::Connect(*m.store, instance, so));
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

  ASSIGN_OR_RETURN(CreatedBackend created, CreateBackend(*m.weights, *m.experts, o));
  m.engine = std::move(created.engine);
  m.threads = created.threads;
  return m;
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
