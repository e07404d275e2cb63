// Dense matrix products out[t, r] = (residual ? residual[t, r] : 0) + W[r, :] . act[t, :], for up
// to three matrices that read the same activations (Q, K and V), in one launch.
// Weights: F32, F16, BF16, Q8_0 in the device layout (device_layout.cuh), all of one type, with
// cols a multiple of 32 (shared by the matrices); the other quantized types: kquant_matvec.cuh.
// Results equal the CPU engine's bit for bit (warp_dot.cuh). Activations: n_tokens rows of the
// weight's dot type.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/multi_token_kernels.h"

namespace mer::cuda {

struct MatvecOutput {
  DevMatrix w;           // [rows, cols]
  float* out = nullptr;  // f32 [n_tokens, out_stride]
  int64_t out_stride = 0;
  const float* residual = nullptr;  // f32 [n_tokens, out_stride] or nullptr; may equal out
};

void LaunchMatvec(const MatvecOutput* outputs, int n_outputs, const DevAct& act, int n_tokens, cudaStream_t stream);

}  // namespace mer::cuda
