#include "common/model/model_config.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer {
namespace {

absl::StatusOr<int32_t> ReadDim(const GgufFile& file, const std::string& key, int64_t max) {
  auto v = file.GetUint64(key);
  if (!v.ok()) return absl::InvalidArgumentError(std::string(v.status().message()));
  if (*v == 0 || *v > static_cast<uint64_t>(max))
    return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "' = ", *v, " is out of range [1, ", max, "]"));
  return static_cast<int32_t>(*v);
}

}  // namespace

absl::StatusOr<ModelConfig> ReadModelConfig(const GgufFile& file) {
  ModelConfig c;
  auto arch = file.GetString("general.architecture");
  if (!arch.ok()) return absl::InvalidArgumentError(std::string(arch.status().message()));
  c.architecture = std::string(*arch);
  if (c.architecture != "qwen3moe")
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported model architecture '", c.architecture, "' (supported: qwen3moe)"));
  if (auto name = file.GetString("general.name"); name.ok()) c.name = std::string(*name);
  const std::string p = c.architecture + ".";

  ASSIGN_OR_RETURN(c.n_ctx_train, ReadDim(file, p + "context_length", 1 << 24));
  ASSIGN_OR_RETURN(c.n_embd, ReadDim(file, p + "embedding_length", 1 << 16));
  ASSIGN_OR_RETURN(c.n_layer, ReadDim(file, p + "block_count", 1024));
  ASSIGN_OR_RETURN(c.n_head, ReadDim(file, p + "attention.head_count", 1024));
  ASSIGN_OR_RETURN(c.n_head_kv, ReadDim(file, p + "attention.head_count_kv", 1024));
  ASSIGN_OR_RETURN(c.n_expert, ReadDim(file, p + "expert_count", 4096));
  ASSIGN_OR_RETURN(c.n_expert_used, ReadDim(file, p + "expert_used_count", 4096));
  ASSIGN_OR_RETURN(c.n_ff_exp, ReadDim(file, p + "expert_feed_forward_length", 1 << 18));
  if (file.FindValue(p + "attention.key_length") != nullptr) {
    ASSIGN_OR_RETURN(c.head_dim, ReadDim(file, p + "attention.key_length", 1024));
  } else {
    if (c.n_embd % c.n_head != 0) return absl::InvalidArgumentError("embedding_length is not a multiple of head_count");
    c.head_dim = c.n_embd / c.n_head;
  }
  if (file.FindValue(p + "attention.value_length") != nullptr) {
    ASSIGN_OR_RETURN(int32_t value_length, ReadDim(file, p + "attention.value_length", 1024));
    if (value_length != c.head_dim) return absl::InvalidArgumentError("attention.value_length differs from key_length");
  }
  if (c.n_head % c.n_head_kv != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("attention.head_count ", c.n_head, " is not a multiple of head_count_kv ", c.n_head_kv));
  if (c.head_dim % 2 != 0) return absl::InvalidArgumentError("attention.key_length must be even (RoPE)");
  if (c.n_expert_used > c.n_expert)
    return absl::InvalidArgumentError(
        absl::StrCat("expert_used_count ", c.n_expert_used, " exceeds expert_count ", c.n_expert));
  if (auto eps = file.GetFloat64(p + "attention.layer_norm_rms_epsilon"); eps.ok()) {
    if (!(*eps > 0 && *eps < 1)) return absl::InvalidArgumentError("layer_norm_rms_epsilon out of range");
    c.rms_norm_eps = static_cast<float>(*eps);
  } else {
    return absl::InvalidArgumentError(std::string(eps.status().message()));
  }
  // Optional keys: absent means the default, present with the wrong type is an error (a silently
  // ignored rope base or expert-weight normalization would give a subtly wrong model).
  if (file.FindValue(p + "rope.freq_base") != nullptr) {
    auto base = file.GetFloat64(p + "rope.freq_base");
    if (!base.ok()) return absl::InvalidArgumentError(std::string(base.status().message()));
    if (!(*base > 1 && *base <= std::numeric_limits<float>::max()))
      return absl::InvalidArgumentError("rope.freq_base must be > 1 (and a finite float)");
    c.rope_freq_base = static_cast<float>(*base);
  }
  if (file.FindValue(p + "expert_weights_norm") != nullptr) {
    auto norm = file.GetBool(p + "expert_weights_norm");
    if (!norm.ok()) return absl::InvalidArgumentError(std::string(norm.status().message()));
    c.norm_topk_prob = *norm;
  }

  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) return absl::InvalidArgumentError("tensor 'token_embd.weight' is missing");
  if (embd->shape.size() != 2 || embd->shape[0] != c.n_embd)
    return absl::InvalidArgumentError(
        absl::StrCat("tensor 'token_embd.weight' has the wrong shape: ", embd->shape.size(),
                     " dimensions, ne[0] = ", embd->shape[0], ", expected [", c.n_embd, ", n_vocab]"));
  if (embd->shape[1] > (1 << 24)) return absl::InvalidArgumentError("vocabulary too large");
  c.n_vocab = static_cast<int32_t>(embd->shape[1]);

  // Keys that describe what the tensors must be: metadata that disagrees with them (or with the
  // graph mer runs) is a file that would load and compute garbage.
  if (file.FindValue(p + "rope.dimension_count") != nullptr) {
    ASSIGN_OR_RETURN(const int32_t rope_dims, ReadDim(file, p + "rope.dimension_count", 1024));
    if (rope_dims != c.head_dim)
      return absl::InvalidArgumentError(absl::StrCat("GGUF key '", p, "rope.dimension_count' = ", rope_dims,
                                                     " differs from the head dimension ", c.head_dim,
                                                     " (qwen3moe rotates every dimension of a head)"));
  }
  if (file.FindValue(p + "expert_shared_count") != nullptr) {
    auto shared = file.GetUint64(p + "expert_shared_count");
    if (!shared.ok() || *shared != 0)
      return absl::InvalidArgumentError(absl::StrCat("GGUF key '", p,
                                                     "expert_shared_count': shared experts are not "
                                                     "part of qwen3moe (mer runs none)"));
  }
  if (const GgufValue* tokens = file.FindValue("tokenizer.ggml.tokens");
      tokens != nullptr && tokens->size() != static_cast<uint64_t>(c.n_vocab))
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.tokens holds ", tokens->size(),
                                                   " tokens but 'token_embd.weight' has ", c.n_vocab,
                                                   " rows: the vocabulary and the embeddings disagree"));
  return c;
}

}  // namespace mer
