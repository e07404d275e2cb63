// Builds the tokenizer stored in a GGUF file's `tokenizer.ggml.*` metadata.
#pragma once

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/tokenizer.h"

namespace mer {

// The tokenizer.ggml.* metadata as is (mer-compute sends it to the gateway).
// InvalidArgument when the tokenizer is absent or of a kind other than `gpt2`.
absl::StatusOr<TokenizerVocab> LoadTokenizerVocab(const GgufFile& file);

// InvalidArgument when the tokenizer is absent, of a kind other than `gpt2`, or inconsistent.
absl::StatusOr<Tokenizer> LoadTokenizer(const GgufFile& file);

}  // namespace mer
