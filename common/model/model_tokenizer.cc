#include "common/model/model_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer {

absl::StatusOr<TokenizerVocab> LoadTokenizerVocab(const GgufFile& file) {
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return absl::InvalidArgumentError(std::string(model.status().message()));
  if (*model != "gpt2")
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer.ggml.model '", *model, "' is not supported (supported: gpt2)"));
  TokenizerVocab vocab;
  if (auto pre = file.GetString("tokenizer.ggml.pre"); pre.ok()) vocab.pre = std::string(*pre);
  const GgufValue* tokens = file.FindValue("tokenizer.ggml.tokens");
  if (tokens == nullptr) return absl::InvalidArgumentError("tokenizer.ggml.tokens is missing");
  ASSIGN_OR_RETURN(std::vector<absl::string_view> token_views, tokens->AsStringArray());
  vocab.tokens.reserve(token_views.size());
  for (absl::string_view t : token_views) vocab.tokens.emplace_back(t);
  if (const GgufValue* types = file.FindValue("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(std::vector<int64_t> t, types->AsIntArray());
    vocab.token_types.assign(t.begin(), t.end());
  } else {
    vocab.token_types.assign(vocab.tokens.size(), 1);
  }
  if (const GgufValue* merges = file.FindValue("tokenizer.ggml.merges")) {
    ASSIGN_OR_RETURN(std::vector<absl::string_view> m, merges->AsStringArray());
    vocab.merges.reserve(m.size());
    for (absl::string_view merge : m) vocab.merges.emplace_back(merge);
  }
  const auto id = [&](const char* key) -> absl::StatusOr<int32_t> {
    if (file.FindValue(key) == nullptr) return -1;
    ASSIGN_OR_RETURN(uint64_t v, file.GetUint64(key));
    if (v >= vocab.tokens.size())
      return absl::InvalidArgumentError(absl::StrCat(key, " = ", v, " is outside the vocabulary"));
    return static_cast<int32_t>(v);
  };
  ASSIGN_OR_RETURN(vocab.bos_id, id("tokenizer.ggml.bos_token_id"));
  ASSIGN_OR_RETURN(vocab.eos_id, id("tokenizer.ggml.eos_token_id"));
  if (auto add_bos = file.GetBool("tokenizer.ggml.add_bos_token"); add_bos.ok()) vocab.add_bos = *add_bos;
  if (auto chat = file.GetString("tokenizer.chat_template"); chat.ok()) vocab.chat_template = std::string(*chat);
  return vocab;
}

absl::StatusOr<Tokenizer> LoadTokenizer(const GgufFile& file) {
  ASSIGN_OR_RETURN(TokenizerVocab vocab, LoadTokenizerVocab(file));
  return Tokenizer::Create(std::move(vocab));
}

}  // namespace mer
