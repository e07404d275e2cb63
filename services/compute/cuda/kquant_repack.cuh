// LaunchRepack (repack.cuh) for Q4_0, IQ4_NL, Q4_K, Q5_K, Q6_K, IQ4_XS and IQ2_XXS matrices: GGUF
// blocks -> the device layout of kquant_layout.cuh (same byte count). Up to kMaxRepackJobs
// matrices of one type per launch.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/repack.cuh"

namespace mer::cuda {

// Bytes of a block of a type LaunchRepackKQuant takes; 0 for any other type.
int KQuantBlockBytes(int type);

void LaunchRepackKQuant(int type, const RepackJob* jobs, int n_jobs, cudaStream_t stream);

}  // namespace mer::cuda
