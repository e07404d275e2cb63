// LaunchRepack (repack.cuh) for Q4_K and Q6_K matrices: GGUF blocks -> the device layout of
// kquant_layout.cuh (same byte count). Up to kMaxRepackJobs matrices of one type per launch.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/repack.cuh"

namespace mer::cuda {

void LaunchRepackKQuant(int type, const RepackJob* jobs, int n_jobs, cudaStream_t stream);

}  // namespace mer::cuda
