// LaunchMatvec (matvec.cuh) for the weight types of kquant_layout.cuh: those of 256-element blocks
// (Q8_K activations, cols a multiple of 256) and those of 32 (Q8_0 or Q8_1, cols a multiple of 32):
// out[t, r] = (residual ? residual[t, r] : 0) + W[r, :] . act[t, :] for up to three matrices of one
// such type that read the same activations, in one launch (cols shared by the matrices). Weights
// in the device layout of kquant_layout.cuh. Results equal the CPU engine's bit for bit
// (kquant_dot.cuh).
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/matvec.cuh"

namespace mer::cuda {

void LaunchMatvecKQuant(const MatvecOutput* outputs, int n_outputs, const DevAct& act, int n_tokens,
                        cudaStream_t stream);

}  // namespace mer::cuda
