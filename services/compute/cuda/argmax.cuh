// Greedy decoding on the GPU: for each of n_rows rows of n f32 logits (row r at logits + r * n),
// ids[r] = the index of the largest value, the lowest index on ties, NaNs never chosen unless at
// index 0: exactly Sampler::Argmax, a scan from index 0 that moves to the first strictly larger
// value (a NaN at 0 is never left, since nothing compares larger than it).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

// Each row is scanned by kArgmaxChunks blocks; the last of them to finish (a per-row ticket) picks
// the row's argmax among their candidates. The scratch: ArgmaxScratchBytes(max_rows) of device
// memory, zeroed once (every launch leaves its tickets at 0 again), for launches of up to max_rows
// rows (its layout depends on max_rows only).
inline constexpr int kArgmaxChunks = 32;
inline int64_t ArgmaxScratchBytes(int max_rows) { return int64_t(max_rows) * (kArgmaxChunks * 16 + 16); }

void LaunchArgmaxRows(const float* logits, int n_rows, int64_t n, int32_t* ids, void* scratch, int max_rows,
                      cudaStream_t stream);

}  // namespace mer::cuda
