// x[t, :] = row tokens[t] of the embedding table, dequantized to f32. The table stays in the GGUF
// layout (F32, F16, BF16, Q8_0 34-byte blocks, Q4_0/IQ4_NL blocks, or Q4_K/Q5_K/Q6_K/IQ4_XS/IQ2_XXS
// blocks with n a multiple of 256); n a multiple of 32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

void LaunchEmbed(int type, const uint8_t* table, int64_t row_bytes, const int32_t* tokens, int n_tokens, int64_t n,
                 float* x, cudaStream_t stream);

}  // namespace mer::cuda
