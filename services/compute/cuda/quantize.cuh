// act[i, :] = f32 rows x[i, :] converted to the activation type (device_layout.cuh), n_rows rows
// of n elements; n a multiple of 32 (256 for Q8_K, kquant_quantize.cuh).
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/device_layout.cuh"

namespace mer::cuda {

void LaunchQuantize(const float* x, int64_t x_stride, int n_rows, int64_t n, const DevAct& act, cudaStream_t stream);

}  // namespace mer::cuda
