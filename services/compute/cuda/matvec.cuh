// Dense matrix products out[t, r] = (residual ? residual[t, r] : 0) + W[r, :] . act[t, :], for up
// to three matrices that read the same activations (Q, K and V), in one launch.
// Weights: F32, F16, BF16, Q8_0 in the device layout (device_layout.cuh), all of one type, with
// cols a multiple of 32 (shared by the matrices); the other quantized types: kquant_matvec.cuh.
// Results equal the CPU engine's bit for bit (warp_dot.cuh). Activations: n_tokens rows of the
// weight's dot type.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/device_layout.cuh"

namespace mer::cuda {

struct MatvecOutput {
  DevMatrix w;           // [rows, cols]
  float* out = nullptr;  // f32 [n_tokens, out_stride]
  int64_t out_stride = 0;
  const float* residual = nullptr;  // f32 [n_tokens, out_stride] or nullptr; may equal out
};

void LaunchMatvec(const MatvecOutput* outputs, int n_outputs, const DevAct& act, int n_tokens, cudaStream_t stream);

// Whether multi-token Q8_0 products (prompts, batches: the dense mat-vecs and the experts) run on
// the tensor cores (mma_q8_0.cuh) rather than in the dp4a kernels (staged_dots.cuh); both give the
// CPU's bits. Off unless MER_CUDA_MMA=1 (read at the first call): on the H100 the tensor-core
// kernels took 32.22 against 30.79 ms per 64-stream step of the 30B geometry, with a lower TTFT
// p99 (docs/benchmarks.md). Process-wide; SetTensorCoreQ8_0 is for tests.
bool TensorCoreQ8_0();
void SetTensorCoreQ8_0(bool on);

}  // namespace mer::cuda
