// Views of a qwen3moe model's tensors inside a memory-mapped GGUF file, with every shape and type
// checked against the configuration at load, so the forward pass never re-validates.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_config.h"
#include "common/tensor/ggml_type.h"

namespace mer {

// A matrix of `rows` rows of `cols` elements each, row-major, in `type` blocks.
struct MatrixView {
  GgmlType type = GgmlType::kF32;
  int64_t cols = 0;  // row length, ne[0]
  int64_t rows = 0;
  const uint8_t* data = nullptr;

  int64_t row_bytes() const { return RowBytes(type, cols); }
  const uint8_t* row(int64_t r) const { return data + r * row_bytes(); }
};

// Weights of one expert: three matrices, each a contiguous slice of its layer's merged tensor.
struct ExpertWeights {
  MatrixView gate;  // [n_ff_exp rows, n_embd cols]
  MatrixView up;    // [n_ff_exp rows, n_embd cols]
  MatrixView down;  // [n_embd rows, n_ff_exp cols]
};

struct LayerWeights {
  const float* attn_norm = nullptr;  // f32 [n_embd]
  MatrixView wq;                     // [q_dim rows, n_embd cols]
  MatrixView wk;                     // [kv_dim rows, n_embd cols]
  MatrixView wv;                     // [kv_dim rows, n_embd cols]
  MatrixView wo;                     // [n_embd rows, q_dim cols]
  const float* q_norm = nullptr;     // f32 [head_dim]
  const float* k_norm = nullptr;     // f32 [head_dim]
  const float* ffn_norm = nullptr;   // f32 [n_embd]
  MatrixView router;                 // [n_expert rows, n_embd cols] (ffn_gate_inp)
  // The merged expert tensors: expert e owns rows [e * n, (e + 1) * n) of each.
  MatrixView gate_exps;  // [n_expert * n_ff_exp rows, n_embd cols]
  MatrixView up_exps;    // [n_expert * n_ff_exp rows, n_embd cols]
  MatrixView down_exps;  // [n_expert * n_embd rows, n_ff_exp cols]
};

// The dense (non-expert) weights and, as views, the expert tensors of the file.
class ModelWeights {
 public:
  // Validates and maps every tensor the qwen3moe graph needs; InvalidArgument names the tensor.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(std::shared_ptr<const GgufFile> file);
  // As Load, for a file without the three merged `*_exps` tensors per layer (an expert store's
  // dense.gguf): gate_exps, up_exps and down_exps stay empty, and Expert() must not be called;
  // the experts come from an ExpertSource. Expert tensors present in the file are ignored.
  static absl::StatusOr<std::unique_ptr<ModelWeights>> LoadDense(std::shared_ptr<const GgufFile> file);

  const ModelConfig& config() const { return config_; }
  const GgufFile& file() const { return *file_; }
  std::shared_ptr<const GgufFile> shared_file() const { return file_; }

  MatrixView token_embd;               // [n_vocab rows, n_embd cols]
  const float* output_norm = nullptr;  // f32 [n_embd]
  MatrixView output;                   // [n_vocab rows, n_embd cols] (token_embd when tied)
  std::vector<LayerWeights> layers;

  // Expert e of `layer` as three matrix views into the file (not after LoadDense).
  ExpertWeights Expert(int layer, int expert) const;

 private:
  explicit ModelWeights(std::shared_ptr<const GgufFile> file) : file_(std::move(file)) {}
  static absl::StatusOr<std::unique_ptr<ModelWeights>> LoadImpl(std::shared_ptr<const GgufFile> file,
                                                                bool with_experts);
  std::shared_ptr<const GgufFile> file_;
  ModelConfig config_;
};

// Byte size of one expert's gate, up and down slices (as stored, padding excluded).
int64_t ExpertBytes(const ModelWeights& weights, int layer);

}  // namespace mer
