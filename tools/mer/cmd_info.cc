// `mer info`: geometry, tensor types and sizes of a GGUF model.
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/model/model_weights.h"
#include "common/quant/kernel_variant.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kHelp[] = R"(usage: mer info [--tensors] FILE.gguf

Prints the model's architecture, geometry, tensor types and sizes, and the CPU kernel variant this
process runs (MER_CPU_KERNELS=avx512|avx2|scalar forces one); --tensors lists every tensor.
)";

absl::Status Info(const Args& args) {
  ASSIGN_OR_RETURN(Flags f, Flags::Parse(args, {}, {"tensors"}));
  if (f.positional().size() != 1) return absl::InvalidArgumentError("expected one model file");
  ASSIGN_OR_RETURN(const std::string kernels, DescribeKernelVariant());
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> owned, GgufFile::Open(f.positional()[0]));
  std::shared_ptr<const GgufFile> file = std::move(owned);
  ASSIGN_OR_RETURN(std::unique_ptr<ModelWeights> w, ModelWeights::Load(file));
  const ModelConfig& c = w->config();
  std::printf("file          %s (GGUF v%u, %s)\n", file->path().c_str(), file->version(),
              Bytes(file->file_size()).c_str());
  std::printf("architecture  %s\n", c.architecture.c_str());
  std::printf("layers        %d\n", c.n_layer);
  std::printf("d_model       %d\n", c.n_embd);
  std::printf("heads         %d query / %d kv x %d dim\n", c.n_head, c.n_head_kv, c.head_dim);
  std::printf("experts       %d, top-%d, ffn %d, norm_topk_prob %s\n", c.n_expert, c.n_expert_used, c.n_ff_exp,
              c.norm_topk_prob ? "true" : "false");
  std::printf("vocab         %d\n", c.n_vocab);
  std::printf("context       %d\n", c.n_ctx_train);
  std::printf("rope base     %g, rms eps %g\n", c.rope_freq_base, c.rms_norm_eps);

  std::map<std::string, std::pair<int, uint64_t>> by_type;
  uint64_t expert_total = 0, dense_total = 0;
  for (const GgufTensorInfo& t : file->tensors()) {
    auto& e = by_type[std::string(TypeName(t.type))];
    ++e.first;
    e.second += t.size_bytes;
    (t.name.find("_exps.weight") != absl::string_view::npos ? expert_total : dense_total) += t.size_bytes;
  }
  std::printf("tensors       %zu\n", file->tensors().size());
  for (const auto& [type, e] : by_type)
    std::printf("  %-6s %4d tensors  %s\n", type.c_str(), e.first, Bytes(e.second).c_str());
  std::printf("expert bytes  %s per expert (layer 0: gate %s, up %s, down %s), %s all experts\n",
              Bytes(ExpertBytes(*w, 0)).c_str(), std::string(TypeName(w->layers[0].gate_exps.type)).c_str(),
              std::string(TypeName(w->layers[0].up_exps.type)).c_str(),
              std::string(TypeName(w->layers[0].down_exps.type)).c_str(), Bytes(expert_total).c_str());
  std::printf("dense bytes   %s (tensors other than the experts)\n", Bytes(dense_total).c_str());
  std::printf("cpu kernels   %s\n", kernels.c_str());
  if (f.Has("tensors")) {
    for (const GgufTensorInfo& t : file->tensors())
      std::printf("  %-32s %-5s [%s] %s\n", std::string(t.name).c_str(), std::string(TypeName(t.type)).c_str(),
                  absl::StrJoin(t.shape, ", ").c_str(), Bytes(t.size_bytes).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

int RunInfo(const Args& args) {
  if (MaybeHelp(args, kHelp)) return 0;
  const absl::Status s = Info(args);
  return s.ok() ? 0 : Fail("info", s);
}

}  // namespace mer::cli
