// LaunchQuantize (quantize.cuh) to Q8_K activations (kquant_layout.cuh): f32 rows x[i, :] of n
// elements (n a multiple of 256), n_rows rows, with the bytes of the CPU's QuantizeRowQ8_K
// (common/quant/q8_k.cc, ggml's quantize_row_q8_K): per 256-block, max = the first element of
// largest magnitude, iscale = -127 / max, q = min(127, round-half-even(iscale * x)), d = 1 / iscale,
// bsums over 16; an all-zero block gives d = 0, q = 0, bsums = 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"

namespace mer::cuda {

void LaunchQuantizeQ8_K(const float* x, int64_t x_stride, int n_rows, int64_t n, const DevAct& act,
                        cudaStream_t stream);

}  // namespace mer::cuda
