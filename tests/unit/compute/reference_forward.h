// A plain double-precision qwen3moe forward pass for tests: weights dequantized to double, no
// activation rounding, exact softmax. Slow and obvious on purpose; the CPU engine is checked
// against it (and against llama.cpp, which cannot test norm_topk_prob = false).
#pragma once

#include <vector>

#include "common/model/model_weights.h"

namespace mer::testing {

// Logits after each token of `tokens` (one sequence from position 0): [tokens.size()][n_vocab].
std::vector<std::vector<double>> ReferenceForward(const ModelWeights& w, const std::vector<int32_t>& tokens);

}  // namespace mer::testing
