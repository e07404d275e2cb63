// y[i, :] = x[src_i, :] / sqrt(mean(x^2) + eps) * w, with the sum of squares in double as ggml;
// written as f32 (y, may be nullptr) and/or as activations (act, type nullable via act.data).
// src_i = rows ? rows[i] : i. n a multiple of 32, at most 8192.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/device_layout.cuh"

namespace mer::cuda {

void LaunchRmsNorm(const float* x, int64_t x_stride, const int32_t* rows, int n_rows, const float* w,
                   float eps, int64_t n, float* y, int64_t y_stride, const DevAct& act,
                   cudaStream_t stream);

}  // namespace mer::cuda
