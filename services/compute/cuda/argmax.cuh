// Greedy decoding on the GPU: for each of n_rows rows of n f32 logits (row r at logits + r * n),
// ids[r] = the index of the largest value, the lowest index on ties, NaNs never chosen unless at
// index 0: exactly Sampler::Argmax, a scan from index 0 that moves to the first strictly larger
// value (a NaN at 0 is never left, since nothing compares larger than it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

void LaunchArgmaxRows(const float* logits, int n_rows, int64_t n, int32_t* ids, cudaStream_t stream);

}  // namespace mer::cuda
