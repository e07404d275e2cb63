// `mer synth`: write a synthetic qwen3moe model.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/chat/chat_template.h"
#include "common/model/synth_model.h"
#include "common/store/synth_store.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kHelp[] = R"(usage: mer synth --preset {micro,tiny,small,qwen3-30b-a3b,qwen3-235b-a22b,random:SEED}
                 [--layers N --embd N --experts N --experts-used N --ff-exp N --heads N
                  --kv-heads N --head-dim N --vocab N --ctx N]
                 --quant TYPE [--seed S] [--router-skew X]
                 [--no-norm-topk] [--threads N] [--row-pool N]
                 [--chat-template qwen3 | --chat-template-file F]
                 [--eos-token TEXT] (--out FILE.gguf | --store-out STORE_DIR [--force] [--no-direct])

Writes a valid qwen3moe GGUF file with deterministic pseudo-random weights. The preset gives the
geometry, the other flags override parts of it; random:SEED is a small geometry drawn from SEED
(1-4 layers, widths not always multiples of 64, 2-128 experts, top-1 to top-8, GQA 1-8, contexts
of 128-1024), for testing on shapes nobody tuned for. --quant picks the tensor types
(docs/quant.md): f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q5_k, q3_k, q2_k, iq4_nl, iq4_xs,
iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s and iq1_s put every matrix but the router in that type;
q3_k_m, q4_k_m and q5_k_m are llama.cpp's recipes of those names; where a row is not whole blocks
of the chosen type, the type falls back as llama.cpp's quantizer does. q4_k is Q4_K with q6_k for the LM head
and half the layers' attn_v and ffn_down (q8_0 where rows are not whole blocks). --router-skew
X > 0 makes expert popularity Zipf-like: the router logit of the expert of popularity rank r gets
-X * ln(r + 1) in every token. Greedy, 31 prompt + 128 generated tokens, an LRU cache of 25% of
the experts hits 73% at 0.675 on the qwen3-30b-a3b geometry (real Qwen3 routing: ~72%), from ~23%
at 0 to ~97% at 2 (docs/benchmarks.md). --no-norm-topk writes expert_weights_norm = false.
--chat-template qwen3 writes Qwen3's chat template as tokenizer.chat_template (--chat-template-file
the Jinja text of F). --eos-token names the token written as the end-of-sequence token:
<|endoftext|> (the default) or <|im_end|>; generation stops at both either way.
--store-out writes the model's expert store instead (what `mer pack` makes of the GGUF, byte for
byte in experts.bin and dense.gguf) without writing the GGUF, for models whose file and store do
not fit on the disk together; --force replaces a store in STORE_DIR, --no-direct writes
experts.bin through the page cache. --threads (default: all cores) generates the weights.
--row-pool N makes every quantized matrix of its first N rows, repeated (row r is row r % N), so a
benchmark file of a large geometry in a slow-to-quantize type (the i-quants: hours for
qwen3-235b-a22b) is written at the disk's speed; the kernels' speed does not depend on the values.
)";

absl::Status Synth(const Args& args) {
  ASSIGN_OR_RETURN(Flags f,
                   Flags::Parse(args, {"preset",   "layers", "embd",      "experts",       "experts-used",
                                       "ff-exp",   "heads",  "kv-heads",  "head-dim",      "vocab",
                                       "ctx",      "quant",  "seed",      "router-skew",   "threads",
                                       "row-pool", "out",    "store-out", "chat-template", "chat-template-file",
                                       "eos-token"},
                                {"no-norm-topk", "force", "no-direct"}));
  const std::string preset = f.String("preset", "tiny");
  std::optional<SynthGeometry> g = SynthPreset(preset);
  if (!g) return absl::InvalidArgumentError(absl::StrCat("--preset: unknown preset '", preset, "'"));
  SynthOptions o;
  const auto dim = [&](const char* name, int32_t& field) -> absl::Status {
    ASSIGN_OR_RETURN(int64_t v, f.Int(name, field));
    if (v < 0 || v > (int64_t{1} << 30)) return absl::InvalidArgumentError(absl::StrCat("--", name, " out of range"));
    field = static_cast<int32_t>(v);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(dim("layers", g->n_layer));
  RETURN_IF_ERROR(dim("embd", g->n_embd));
  RETURN_IF_ERROR(dim("experts", g->n_expert));
  RETURN_IF_ERROR(dim("experts-used", g->n_expert_used));
  RETURN_IF_ERROR(dim("ff-exp", g->n_ff_exp));
  RETURN_IF_ERROR(dim("heads", g->n_head));
  RETURN_IF_ERROR(dim("kv-heads", g->n_head_kv));
  RETURN_IF_ERROR(dim("head-dim", g->head_dim));
  RETURN_IF_ERROR(dim("vocab", g->n_vocab));
  RETURN_IF_ERROR(dim("ctx", g->n_ctx));
  o.geometry = *g;
  ASSIGN_OR_RETURN(const std::string quant, f.Required("quant"));
  std::optional<SynthQuant> q = ParseSynthQuant(quant);
  if (!q)
    return absl::InvalidArgumentError(
        absl::StrCat("--quant: unknown type '", quant, "' (one of ", SynthQuantNames(), ")"));
  o.quant = *q;
  ASSIGN_OR_RETURN(int64_t seed, f.Int("seed", 1));
  o.seed = static_cast<uint64_t>(seed);
  ASSIGN_OR_RETURN(o.router_skew, f.Double("router-skew", 0.0));
  ASSIGN_OR_RETURN(int64_t threads, f.Int("threads", 0));
  o.threads = static_cast<int>(threads);
  ASSIGN_OR_RETURN(int64_t row_pool, f.Int("row-pool", 0));
  if (row_pool < 0 || row_pool > (int64_t{1} << 20)) return absl::InvalidArgumentError("--row-pool out of range");
  o.row_pool = static_cast<int>(row_pool);
  o.norm_topk_prob = !f.Has("no-norm-topk");
  if (f.Has("chat-template") && f.Has("chat-template-file"))
    return absl::InvalidArgumentError("give at most one of --chat-template and --chat-template-file");
  if (f.Has("chat-template")) {
    if (f.String("chat-template") != "qwen3")
      return absl::InvalidArgumentError("--chat-template: the built-in template is 'qwen3'");
    o.chat_template = std::string(Qwen3ChatTemplate());
  }
  if (f.Has("chat-template-file")) {
    std::ifstream in(f.String("chat-template-file"), std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", f.String("chat-template-file")));
    o.chat_template.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    RETURN_IF_ERROR(ChatTemplate::Parse(o.chat_template).status());
  }
  o.eos_token = f.String("eos-token", o.eos_token);
  if (f.Has("out") == f.Has("store-out"))
    return absl::InvalidArgumentError("give exactly one of --out and --store-out");
  if (f.Has("out")) return WriteSynthModel(o, f.String("out"));
  const std::string dir = f.String("store-out");
  PackOptions po;
  po.threads = o.threads;
  po.overwrite = f.Has("force");
  po.direct_io = !f.Has("no-direct");
  po.progress = [](int done, int n_layer) {
    if (done % 8 == 0 || done == n_layer)
      std::fprintf(stderr, "mer synth: %d of %d layers of experts\n", done, n_layer);
  };
  ASSIGN_OR_RETURN(const PackStats s, WriteSynthStore(o, dir, po));
  std::printf(
      "synthesized  %s: %llu blobs x %llu bytes = %.2f GiB%s, dense.gguf %.2f GiB, in %.1f s "
      "(experts %.1f s, %.2f GB/s)\n",
      dir.c_str(), static_cast<unsigned long long>(s.blob_count), static_cast<unsigned long long>(s.blob_bytes),
      s.experts_bytes / 1073741824.0, s.direct_io ? " (O_DIRECT)" : "", s.dense_bytes / 1073741824.0, s.seconds,
      s.experts_seconds, s.experts_bytes / 1e9 / std::max(s.experts_seconds, 1e-9));
  return absl::OkStatus();
}

}  // namespace

int RunSynth(const Args& args) {
  if (MaybeHelp(args, kHelp)) return 0;
  const absl::Status s = Synth(args);
  return s.ok() ? 0 : Fail("synth", s);
}

}  // namespace mer::cli
