// Builds the tokenizer stored in a GGUF file's `tokenizer.ggml.*` metadata.
#pragma once

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/tokenizer/tokenizer.h"

namespace mer {

// InvalidArgument when the tokenizer is absent, of a kind other than `gpt2`, or inconsistent.
absl::StatusOr<Tokenizer> LoadTokenizer(const GgufFile& file);

}  // namespace mer
