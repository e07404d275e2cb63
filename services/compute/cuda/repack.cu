#include "services/compute/cuda/repack.cuh"

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/kquant_repack.cuh"

namespace mer::cuda {
namespace {

struct RepackArgs {
  RepackJob jobs[kMaxRepackJobs];
};

// Q8_0: thread per block; quants to dst[b * 32], scale to the scales array after all quants.
__global__ void RepackQ8_0Kernel(const __grid_constant__ RepackArgs args) {
  const RepackJob& j = args.jobs[blockIdx.y];
  const int64_t n_blocks = j.bytes / 34;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < n_blocks; b += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* s = j.src + b * 34;
    const int64_t nb = j.cols / 32, row = b / nb, bi = b % nb;
    uint8_t* q = j.dst + row * j.cols;
#pragma unroll
    for (int i = 0; i < 32; i += 4) {
      const uint32_t v =
          uint32_t{s[2 + i]} | uint32_t{s[3 + i]} << 8 | uint32_t{s[4 + i]} << 16 | uint32_t{s[5 + i]} << 24;
      *reinterpret_cast<uint32_t*>(q + Q8_0QuantOffset(bi * 32 + i, nb)) = v;
    }
    reinterpret_cast<uint16_t*>(j.dst + n_blocks * 32)[b] = static_cast<uint16_t>(s[0] | (s[1] << 8));
  }
}

__global__ void CopyKernel(const __grid_constant__ RepackArgs args) {
  const RepackJob& j = args.jobs[blockIdx.y];
  const int64_t n = j.bytes / 4;  // F32/F16/BF16 matrices have an even element count
  const uint32_t* s = reinterpret_cast<const uint32_t*>(j.src);
  uint32_t* d = reinterpret_cast<uint32_t*>(j.dst);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = s[i];
}

}  // namespace

void LaunchRepackByType(const TypedRepackJob* jobs, int n_jobs, cudaStream_t stream) {
  RepackJob batch[kMaxRepackJobs];
  for (int i = 0; i < n_jobs; ++i) {
    const int type = jobs[i].type;
    bool seen_before = false;
    for (int k = 0; k < i && !seen_before; ++k) seen_before = jobs[k].type == type;
    if (seen_before) continue;
    int n = 0;
    for (int k = i; k < n_jobs; ++k) {
      if (jobs[k].type != type) continue;
      batch[n++] = jobs[k].job;
      if (n == kMaxRepackJobs) {
        LaunchRepack(type, batch, n, stream);
        n = 0;
      }
    }
    LaunchRepack(type, batch, n, stream);
  }
}

void LaunchRepack(int type, const RepackJob* jobs, int n_jobs, cudaStream_t stream) {
  if (n_jobs == 0) return;
  if (n_jobs > kMaxRepackJobs) {
    std::fprintf(stderr, "repack: %d jobs in one launch (at most %d)\n", n_jobs, kMaxRepackJobs);
    std::abort();
  }
  if (KQuantBlockBytes(type) != 0) return LaunchRepackKQuant(type, jobs, n_jobs, stream);
  RepackArgs args{};
  for (int i = 0; i < n_jobs; ++i) args.jobs[i] = jobs[i];
  const dim3 grid(64, n_jobs);
  if (type == kDevQ8_0)
    RepackQ8_0Kernel<<<grid, 256, 0, stream>>>(args);
  else
    CopyKernel<<<grid, 256, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

}  // namespace mer::cuda
