// x[t, :] = row tokens[t] of the embedding table, dequantized to f32. The table stays in the GGUF
// layout (F32, F16, BF16, Q8_0 34-byte blocks, or the blocks of a type of kquant_layout.cuh, n a
// multiple of the type's block); n a multiple of 32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

void LaunchEmbed(int type, const uint8_t* table, int64_t row_bytes, const int32_t* tokens, int n_tokens, int64_t n,
                 float* x, cudaStream_t stream);

}  // namespace mer::cuda
