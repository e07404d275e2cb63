// `mer bench`: prompt and decode speed by the method of docs/benchmarks.md (greedy, fixed prompt,
// one warm-up and several measured runs, medians reported).
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/quant/kernel_variant.h"
#include "services/compute/generation.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kHelp[] = R"(usage: mer bench (--model F.gguf | --store STORE_DIR --residency NAME) [--threads N]
                 [--prompt-tokens 31 | --prompt-ids 1,2,3]
                 [--gen-tokens 128] [--runs 3] [--warmup 1] [--batch N] [--ctx N]
                 [--backend cpu|cuda] [--vram-expert-budget BYTES|PERCENT%] [--pin-experts 0|1]
                 [--vram-prefetch 0|1] [--profile-kernels 0|1] [--attention-split-cells N]
                 [--attention-flash-min-tokens N] [--multi-token-kernels auto|dp4a|exact|fast]
                 [--temperature T --seed S]

Greedy generation of --gen-tokens tokens after a fixed prompt of --prompt-tokens tokens (the
start of a fixed English text, repeated as needed), end-of-sequence ignored; --temperature > 0
samples instead (seeded, the same tokens every run). Prints prompt tokens/s, decode tokens/s
(tokens after the first over the time after the first), TTFT, mean total time (medians over the
measured runs), peak RSS and the CPU kernel variant (MER_CPU_KERNELS=avx512|avx2|scalar forces
one); for the cuda backend also, over the measured runs, the VRAM hit rate
of expert lookups, misses and bytes uploaded per token, host synchronisations per token,
look-ahead prefetches per token, and the arena and peak device memory; --profile-kernels 1 also
times every kernel with CUDA events (graphs off, so the step is slower than without) and prints
GPU time per kernel kind; --attention-split-cells N runs attention split-K in steps whose context
passes N cells (not bit-exact with the CPU; 0: never; default: the cuda engine's 512);
--attention-flash-min-tokens N runs attention on the tensor cores in steps with a run of at least
N tokens of one sequence (prompt chunks; not bit-exact with the CPU; 0: never; default: the cuda
engine's 64); --batch N: the prompt chunk, tokens per step (default 256 on cpu, 1024 on cuda,
where longer chunks run faster);
--multi-token-kernels picks the kernels of prompt chunks' Q8_0 products (mer-compute --help). With --store
and --residency the experts come from the mer-residency instance NAME (its RAM tier, filled from
the store).
)";

constexpr char kPromptText[] =
    "The quick brown fox jumps over the lazy dog. Mixture-of-experts models route every token to a "
    "few experts, so the weights that a step reads change from token to token, and a cache of hot "
    "experts decides how fast the model runs when it does not fit in memory. ";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

absl::Status Bench(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args,
                                         {"model",
                                          "store",
                                          "residency",
                                          "threads",
                                          "ctx",
                                          "batch",
                                          "prompt-tokens",
                                          "prompt-ids",
                                          "gen-tokens",
                                          "runs",
                                          "warmup",
                                          "backend",
                                          "vram-expert-budget",
                                          "pin-experts",
                                          "vram-prefetch",
                                          "profile-kernels",
                                          "attention-split-cells",
                                          "attention-flash-min-tokens",
                                          "multi-token-kernels",
                                          "temperature",
                                          "seed"},
                                         {}));
  ASSIGN_OR_RETURN(const int64_t n_prompt, f.Int("prompt-tokens", 31));
  ASSIGN_OR_RETURN(const int64_t n_gen, f.Int("gen-tokens", 128));
  ASSIGN_OR_RETURN(const int64_t runs, f.Int("runs", 3));
  ASSIGN_OR_RETURN(const int64_t warmup, f.Int("warmup", 1));
  if (n_prompt < 1 || n_gen < 2 || runs < 1 || warmup < 0)
    return absl::InvalidArgumentError("need --prompt-tokens >= 1, --gen-tokens >= 2, --runs >= 1");
  // Refused here, before the model loads, when MER_CPU_KERNELS names a variant this CPU lacks.
  ASSIGN_OR_RETURN(const std::string cpu_kernels, DescribeKernelVariant());
  ASSIGN_OR_RETURN(LoadedModel m, LoadModel(f, static_cast<int>(n_prompt + n_gen)));

  std::vector<int32_t> prompt;
  if (f.Has("prompt-ids")) {
    ASSIGN_OR_RETURN(prompt, ParseIdList(f.String("prompt-ids"), "--prompt-ids"));
    if (prompt.empty()) return absl::InvalidArgumentError("--prompt-ids is empty");
  } else {
    const std::vector<int32_t> text = m.tokenizer->Encode(kPromptText, false);
    while (static_cast<int64_t>(prompt.size()) < n_prompt) prompt.insert(prompt.end(), text.begin(), text.end());
    prompt.resize(n_prompt);
  }

  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = static_cast<int32_t>(n_gen);
  ASSIGN_OR_RETURN(const double temperature, f.Double("temperature", 0.0));
  ASSIGN_OR_RETURN(const int64_t seed, f.Int("seed", 1));
  req.sampling.temperature = static_cast<float>(temperature);
  req.sampling.seed = static_cast<uint64_t>(seed);
  std::vector<double> prompt_tps, decode_tps, ttft, total;
  BackendCounters before;
  for (int64_t r = 0; r < warmup + runs; ++r) {
    if (r == warmup) before = m.engine->counters();
    GenerationStats s;
    ASSIGN_OR_RETURN(std::vector<int32_t> out, mer::Generate(*m.engine, 0, req, {}, &s));
    if (r < warmup) continue;
    prompt_tps.push_back(s.prompt_tokens / s.prompt_seconds);
    decode_tps.push_back((s.generated_tokens - 1) / s.decode_seconds);
    ttft.push_back(s.ttft_seconds);
    total.push_back(s.ttft_seconds + s.decode_seconds);
  }
  double mean_total = 0;
  for (double t : total) mean_total += t / total.size();
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  const ModelConfig& c = m.weights->config();
  const std::optional<ExpertTypes> types = m.experts->expert_types(0);
  std::printf("model            %s (%d layers, d_model %d, %d experts top-%d, ffn %d, %s experts)\n",
              m.store ? absl::StrCat(m.store->dir(), " via mer-residency ", f.String("residency")).c_str()
                      : f.String("model").c_str(),
              c.n_layer, c.n_embd, c.n_expert, c.n_expert_used, c.n_ff_exp,
              types ? std::string(TypeName(types->gate)).c_str() : "?");
  std::printf("method           %s, %zu prompt + %lld generated tokens, %lld warm-up + %lld runs, %d threads\n",
              temperature > 0 ? absl::StrCat("temperature ", temperature).c_str() : "greedy", prompt.size(),
              (long long)n_gen, (long long)warmup, (long long)runs, m.threads);
  std::printf("prompt_tps       %.1f\n", Median(prompt_tps));
  std::printf("decode_tps       %.1f\n", Median(decode_tps));
  std::printf("ttft_p50_ms      %.2f\n", Median(ttft) * 1e3);
  std::printf("total_mean_s     %.3f\n", mean_total);
  std::printf("peak_rss_mib     %.1f\n", ru.ru_maxrss / 1024.0);
  std::printf("backend          %s\n", m.backend.c_str());
  std::printf("cpu_kernels      %s\n", cpu_kernels.c_str());
  if (m.residency != nullptr) std::printf("residency        %s\n", m.residency->FormatStats().c_str());
  const BackendCounters after = m.engine->counters();
  if (after.device) {
    const double tokens = static_cast<double>(after.tokens - before.tokens);
    const double lookups = static_cast<double>(after.expert_lookups - before.expert_lookups);
    const double misses = static_cast<double>(after.expert_misses - before.expert_misses);
    std::printf("arena            %lld of %lld experts (%.1f%%), %.2f GiB, host experts %s\n",
                (long long)after.arena_slots, (long long)after.total_experts,
                100.0 * after.arena_slots / after.total_experts, after.arena_bytes / 1073741824.0,
                m.residency != nullptr      ? m.residency->ram_tier_pinning().c_str()
                : after.host_experts_pinned ? "pinned"
                                            : "pageable");
    std::printf("vram_hit_rate    %.4f\n", lookups > 0 ? 1.0 - misses / lookups : 1.0);
    std::printf("misses_per_token %.2f\n", misses / tokens);
    std::printf("upload_mib_per_token %.2f\n",
                (after.expert_upload_bytes - before.expert_upload_bytes) / tokens / 1048576.0);
    std::printf("host_syncs_per_token %.2f\n", (after.host_syncs - before.host_syncs) / tokens);
    const double issued = static_cast<double>(after.vram_prefetch_issued - before.vram_prefetch_issued);
    std::printf("prefetch_per_token %.2f issued, %.2f useful, %.2f wasted\n", issued / tokens,
                (after.vram_prefetch_useful - before.vram_prefetch_useful) / tokens,
                (after.vram_prefetch_wasted - before.vram_prefetch_wasted) / tokens);
    std::printf("graph_steps      %lld\n", (long long)(after.graph_launches - before.graph_launches));
    std::printf("peak_vram_gib    %.2f\n", after.vram_used_peak_bytes / 1073741824.0);
    const std::string profile = m.engine->KernelProfile();
    if (!profile.empty())
      std::printf("kernel profile (all runs, events between launches, no graphs)\n%s", profile.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunBench(const Args& args) {
  if (MaybeHelp(args, kHelp)) return 0;
  const absl::Status s = Bench(args);
  return s.ok() ? 0 : Fail("bench", s);
}

}  // namespace mer::cli
