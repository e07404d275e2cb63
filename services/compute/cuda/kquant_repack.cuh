// LaunchRepack (repack.cuh) for matrices of the types of kquant_layout.cuh: GGUF blocks -> the
// device layout there (same byte count). Up to kMaxRepackJobs matrices of one type per launch.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/repack.cuh"

namespace mer::cuda {

// Bytes of a block of a type LaunchRepackKQuant takes; 0 for any other type.
int KQuantBlockBytes(int type);

void LaunchRepackKQuant(int type, const RepackJob* jobs, int n_jobs, cudaStream_t stream);

}  // namespace mer::cuda
