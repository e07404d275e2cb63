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

// Which kernels take the multi-token Q8_0 products (prompts, batches: the dense mat-vecs and the
// experts). Single-token products (decode) always give the CPU's bits.
//   kDp4a:     integer dot products (staged_dots.cuh), the CPU's bits (the default);
//   kMmaExact: tensor cores (mma_q8_0.cuh), the CPU's bits: 8 masked mmas per 32-block, since the
//              CPU's integer sums are 4-product lane sums;
//   kMmaFast:  tensor cores, one mma per 32-block: each output is one f32 chain over the blocks of
//              fma(d_w * d_a, int32 block sum, acc) instead of the CPU's 8 lane chains and their
//              tree, so results differ from the CPU's in the last bits (docs/cuda.md states the
//              bound the tests keep).
// MER_CUDA_MMA=0 (or unset), 1 or fast, read at the first call; on the H100 the exact tensor-core
// kernels took 32.22 against 30.79 ms per 64-stream step of the 30B geometry (docs/benchmarks.md).
// Process-wide; SetMultiTokenQ8_0 is for tests and benchmarks.
enum class MultiTokenQ8_0 { kDp4a = 0, kMmaExact = 1, kMmaFast = 2 };
MultiTokenQ8_0 MultiTokenQ8_0Kernels();
void SetMultiTokenQ8_0(MultiTokenQ8_0 kernels);

}  // namespace mer::cuda
