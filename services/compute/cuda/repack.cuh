// GGUF bytes -> device layout (device_layout.cuh) for a batch of matrices already in device
// memory: Q8_0's 34-byte blocks split into quants and scales; the blocks of the types of
// kquant_layout.cuh regrouped (kquant_repack.cuh); F32, F16 and BF16 copied as is.
// Used for the dense weights at start and for every expert uploaded into the arena.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

struct RepackJob {
  const uint8_t* src;  // GGUF layout
  uint8_t* dst;        // device layout, same byte count
  int64_t bytes;       // of the matrix (rows * row bytes)
  int64_t cols;        // row length (Q8_0: the interleave is per row)
};

// Up to kMaxRepackJobs matrices of one type per launch.
inline constexpr int kMaxRepackJobs = 48;
void LaunchRepack(int type, const RepackJob* jobs, int n_jobs, cudaStream_t stream);

// A batch of matrices of mixed types (the parts of uploaded experts): LaunchRepack for each type
// present, in the order the types first appear, kMaxRepackJobs jobs at a time.
struct TypedRepackJob {
  int type;  // DevType
  RepackJob job;
};
void LaunchRepackByType(const TypedRepackJob* jobs, int n_jobs, cudaStream_t stream);

}  // namespace mer::cuda
