// Hyper-parameters of a qwen3moe model, read from GGUF metadata (the `qwen3moe.*` keys that
// llama.cpp's converter writes), and validated so that every later size computation is safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"

namespace mer {

struct ModelConfig {
  std::string architecture;     // "qwen3moe"
  std::string name;             // general.name, informational
  int32_t n_vocab = 0;          // rows of token_embd
  int32_t n_ctx_train = 0;      // context_length
  int32_t n_embd = 0;           // embedding_length (d_model)
  int32_t n_layer = 0;          // block_count
  int32_t n_head = 0;           // attention.head_count
  int32_t n_head_kv = 0;        // attention.head_count_kv
  int32_t head_dim = 0;         // attention.key_length (== value_length)
  int32_t n_expert = 0;         // expert_count
  int32_t n_expert_used = 0;    // expert_used_count (top-k)
  int32_t n_ff_exp = 0;         // expert_feed_forward_length
  float rms_norm_eps = 1e-6f;   // attention.layer_norm_rms_epsilon
  float rope_freq_base = 1e6f;  // rope.freq_base
  bool norm_topk_prob = true;   // expert_weights_norm (absent: true, as llama.cpp always does for qwen3moe)

  int32_t q_dim() const { return n_head * head_dim; }
  int32_t kv_dim() const { return n_head_kv * head_dim; }
};

// Reads and validates the configuration; InvalidArgument names the missing or bad key.
absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file);

}  // namespace mer
