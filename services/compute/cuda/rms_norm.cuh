// y[i, :] = x[src_i, :] / sqrt(mean(x^2) + eps) * w, with the sum of squares in double as ggml;
// written as f32 (y, may be nullptr) and/or as activations (act, type nullable via act.data).
// src_i = rows ? rows[i] : i. n a multiple of 32, at most 8192.
// With combine.expert_out, the previous MoE block's output is first added into the residual
// stream (x[src_i, :] += sum_j weights[src_i, j] * expert_out[src_i * k + j, :], in top-k order
// with the CPU engine's rounding) and x is updated, saving a launch per layer.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/device_layout.cuh"

namespace mer::cuda {

struct MoeCombine {
  const float* expert_out = nullptr;  // f32 [n_tokens * k, n], or nullptr: no combine
  const float* weights = nullptr;     // f32 [n_tokens, k]
  int k = 0;
};

void LaunchRmsNorm(float* x, int64_t x_stride, const int32_t* rows, int n_rows, const MoeCombine& combine,
                   const float* w, float eps, int64_t n, float* y, int64_t y_stride, const DevAct& act,
                   cudaStream_t stream);

}  // namespace mer::cuda
