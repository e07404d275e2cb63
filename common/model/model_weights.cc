#include "common/model/model_weights.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/check.h"
#include "common/base/status.h"

namespace mer {
namespace {

class TensorLoader {
 public:
  explicit TensorLoader(const GgufFile& file) : file_(file) {}

  absl::StatusOr<const GgufTensorInfo*> Find(const std::string& name, std::initializer_list<int64_t> shape) {
    const GgufTensorInfo* t = file_.FindTensor(name);
    if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is missing"));
    used_.insert(name);
    const std::vector<int64_t> want(shape);
    if (t->shape != want) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape [", absl::StrJoin(t->shape, ", "),
                                                     "], expected [", absl::StrJoin(want, ", "), "]"));
    }
    // The kernels read the data in place as float / uint16 / block structs, which needs the natural
    // alignment of the element. The parser only guarantees offsets aligned to general.alignment,
    // which may legally be 1 or 2, and Parse()d bytes may start anywhere.
    const uintptr_t align = t->type == GgmlType::kF32 ? alignof(float) : alignof(uint16_t);
    if (reinterpret_cast<uintptr_t>(t->data) % align != 0)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' data is not ", align,
                                                     "-byte aligned (general.alignment ", file_.alignment(), ")"));
    return t;
  }

  absl::StatusOr<const float*> Vector(const std::string& name, int64_t n) {
    ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name, {n}));
    if (t->type != GgmlType::kF32)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is ", TypeName(t->type), ", expected f32"));
    return reinterpret_cast<const float*>(t->data);  // alignment checked by Find
  }

  // A matrix of `rows` rows of `cols`; `experts` > 0 reads a 3-D merged expert tensor.
  absl::StatusOr<MatrixView> Matrix(const std::string& name, int64_t cols, int64_t rows, int64_t experts = 0) {
    const GgufTensorInfo* t;
    if (experts > 0) {
      ASSIGN_OR_RETURN(t, Find(name, {cols, rows, experts}));
    } else {
      ASSIGN_OR_RETURN(t, Find(name, {cols, rows}));
    }
    return MatrixView{t->type, cols, rows * std::max<int64_t>(experts, 1), t->data};
  }

  // The names Find was asked for.
  const std::set<std::string>& used() const { return used_; }

 private:
  const GgufFile& file_;
  std::set<std::string> used_;
};

// blk.L.ffn_{gate,up,down}_exps.weight for L < n_layer.
bool IsExpertTensor(const std::string& name, int n_layer) {
  for (int il = 0; il < n_layer; ++il) {
    const std::string b = absl::StrCat("blk.", il, ".ffn_");
    if (name == b + "gate_exps.weight" || name == b + "up_exps.weight" || name == b + "down_exps.weight") return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(std::shared_ptr<const GgufFile> file) {
  return LoadImpl(std::move(file), /*with_experts=*/true);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::LoadDense(std::shared_ptr<const GgufFile> file) {
  return LoadImpl(std::move(file), /*with_experts=*/false);
}

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::LoadImpl(std::shared_ptr<const GgufFile> file,
                                                                     bool with_experts) {
  std::unique_ptr<ModelWeights> w(new ModelWeights(file));
  ASSIGN_OR_RETURN(w->config_, ReadModelConfig(*file));
  const ModelConfig& c = w->config_;
  TensorLoader load(*file);

  ASSIGN_OR_RETURN(w->token_embd, load.Matrix("token_embd.weight", c.n_embd, c.n_vocab));
  ASSIGN_OR_RETURN(w->output_norm, load.Vector("output_norm.weight", c.n_embd));
  if (file->FindTensor("output.weight") != nullptr) {
    ASSIGN_OR_RETURN(w->output, load.Matrix("output.weight", c.n_embd, c.n_vocab));
  } else {
    w->output = w->token_embd;  // tied embeddings
  }
  w->layers.resize(c.n_layer);
  for (int il = 0; il < c.n_layer; ++il) {
    LayerWeights& l = w->layers[il];
    const std::string b = absl::StrCat("blk.", il, ".");
    ASSIGN_OR_RETURN(l.attn_norm, load.Vector(b + "attn_norm.weight", c.n_embd));
    ASSIGN_OR_RETURN(l.wq, load.Matrix(b + "attn_q.weight", c.n_embd, c.q_dim()));
    ASSIGN_OR_RETURN(l.wk, load.Matrix(b + "attn_k.weight", c.n_embd, c.kv_dim()));
    ASSIGN_OR_RETURN(l.wv, load.Matrix(b + "attn_v.weight", c.n_embd, c.kv_dim()));
    ASSIGN_OR_RETURN(l.wo, load.Matrix(b + "attn_output.weight", c.q_dim(), c.n_embd));
    ASSIGN_OR_RETURN(l.q_norm, load.Vector(b + "attn_q_norm.weight", c.head_dim));
    ASSIGN_OR_RETURN(l.k_norm, load.Vector(b + "attn_k_norm.weight", c.head_dim));
    ASSIGN_OR_RETURN(l.ffn_norm, load.Vector(b + "ffn_norm.weight", c.n_embd));
    ASSIGN_OR_RETURN(l.router, load.Matrix(b + "ffn_gate_inp.weight", c.n_embd, c.n_expert));
    if (!with_experts) continue;
    ASSIGN_OR_RETURN(l.gate_exps, load.Matrix(b + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert));
    ASSIGN_OR_RETURN(l.up_exps, load.Matrix(b + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp, c.n_expert));
    ASSIGN_OR_RETURN(l.down_exps, load.Matrix(b + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd, c.n_expert));
  }
  // Every tensor of the file is one the graph reads (as llama.cpp requires): a tensor of a layer
  // past block_count, or of a kind qwen3moe has not, means the metadata does not describe the file.
  const std::set<std::string> used = load.used();
  for (const GgufTensorInfo& t : file->tensors()) {
    const std::string name(t.name);
    if (used.count(name) != 0) continue;
    if (!with_experts && IsExpertTensor(name, c.n_layer)) continue;
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' is not part of a ", c.n_layer, "-layer ",
                                                   c.architecture,
                                                   " model (the metadata does not describe this file)"));
  }
  return w;
}

ExpertWeights ModelWeights::Expert(int layer, int expert) const {
  const LayerWeights& l = layers[layer];
  CHECK_MSG(l.gate_exps.data != nullptr, "ModelWeights::Expert on weights loaded with LoadDense");
  const auto slice = [expert](const MatrixView& merged, int64_t rows) {
    return MatrixView{merged.type, merged.cols, rows, merged.row(expert * rows)};
  };
  return {slice(l.gate_exps, config_.n_ff_exp), slice(l.up_exps, config_.n_ff_exp), slice(l.down_exps, config_.n_embd)};
}

int64_t ExpertBytes(const ModelWeights& weights, int layer) {
  const ExpertWeights e = weights.Expert(layer, 0);
  return e.gate.rows * e.gate.row_bytes() + e.up.rows * e.up.row_bytes() + e.down.rows * e.down.row_bytes();
}

}  // namespace mer
