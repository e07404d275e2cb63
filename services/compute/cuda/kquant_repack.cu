#include "services/compute/cuda/kquant_repack.cuh"

#include <cstdio>
#include <cstdlib>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/kquant_layout.cuh"

namespace mer::cuda {
namespace {

struct KQuantRepackArgs {
  RepackJob jobs[kMaxRepackJobs];
};

// A thread per block (blocks are row-major, so block b of the matrix is the file's block b).
template <int kType>
__global__ void RepackKQuantKernel(const __grid_constant__ KQuantRepackArgs args) {
  constexpr int kBytes = kType == kDevQ2_K      ? kQ2_KBlockBytes
                         : kType == kDevQ3_K    ? kQ3_KBlockBytes
                         : kType == kDevQ4_K    ? kQ4_KBlockBytes
                         : kType == kDevQ6_K    ? kQ6_KBlockBytes
                         : kType == kDevQ5_K    ? kQ5_KBlockBytes
                         : kType == kDevIQ4_XS  ? kIQ4_XSBlockBytes
                         : kType == kDevIQ2_XXS ? kIQ2_XXSBlockBytes
                         : kType == kDevIQ2_XS  ? kIQ2_XSBlockBytes
                         : kType == kDevIQ3_XXS ? kIQ3_XXSBlockBytes
                         : kType == kDevIQ3_S   ? kIQ3_SBlockBytes
                         : kType == kDevIQ2_S   ? kIQ2_SBlockBytes
                         : kType == kDevIQ1_S   ? kIQ1_SBlockBytes
                         : kType == kDevQ5_0    ? kQ5_0BlockBytes
                         : kType == kDevQ4_1    ? kQ4_1BlockBytes
                         : kType == kDevQ5_1    ? kQ5_1BlockBytes
                                                : kTable4BlockBytes;
  const RepackJob& j = args.jobs[blockIdx.y];
  const int64_t n = j.bytes / kBytes;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < n; b += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (kType == kDevQ4_K)
      RepackQ4_KBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevQ2_K)
      RepackQ2_KBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevQ3_K)
      RepackQ3_KBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevQ6_K)
      RepackQ6_KBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevQ5_K)
      RepackQ5_KBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevIQ4_XS)
      RepackIQ4_XSBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevIQ2_XXS)
      RepackIQ2_XXSBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevIQ2_XS)
      RepackIQ2_XSBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevIQ3_XXS)
      RepackIQ3_XXSBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevIQ3_S)
      RepackIQ3_SBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevIQ2_S)
      RepackIQ2_SBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevIQ1_S)
      RepackIQ1_SBlock(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevQ5_0)
      RepackQ5_0Block(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevQ4_1)
      RepackQ4_1Block(j.src + b * kBytes, j.dst, n, b);
    else if constexpr (kType == kDevQ5_1)
      RepackQ5_1Block(j.src + b * kBytes, j.dst, n, b);
    else
      RepackTable4Block(j.src + b * kBytes, j.dst, n, b);
  }
}

}  // namespace

int KQuantBlockBytes(int type) {
  switch (type) {
    case kDevQ2_K:
      return kQ2_KBlockBytes;
    case kDevQ3_K:
      return kQ3_KBlockBytes;
    case kDevQ4_K:
      return kQ4_KBlockBytes;
    case kDevQ5_K:
      return kQ5_KBlockBytes;
    case kDevQ6_K:
      return kQ6_KBlockBytes;
    case kDevIQ4_XS:
      return kIQ4_XSBlockBytes;
    case kDevIQ2_XXS:
      return kIQ2_XXSBlockBytes;
    case kDevIQ2_XS:
      return kIQ2_XSBlockBytes;
    case kDevIQ3_XXS:
      return kIQ3_XXSBlockBytes;
    case kDevIQ3_S:
      return kIQ3_SBlockBytes;
    case kDevIQ2_S:
      return kIQ2_SBlockBytes;
    case kDevIQ1_S:
      return kIQ1_SBlockBytes;
    case kDevQ4_0:
    case kDevIQ4_NL:
      return kTable4BlockBytes;
    case kDevQ5_0:
      return kQ5_0BlockBytes;
    case kDevQ4_1:
      return kQ4_1BlockBytes;
    case kDevQ5_1:
      return kQ5_1BlockBytes;
    default:
      return 0;
  }
}

void LaunchRepackKQuant(int type, const RepackJob* jobs, int n_jobs, cudaStream_t stream) {
  if (n_jobs == 0) return;
  const int block_bytes = KQuantBlockBytes(type);
  if (block_bytes == 0 || n_jobs > kMaxRepackJobs) {
    std::fprintf(stderr, "repack (k-quant): type %d, %d jobs\n", type, n_jobs);
    std::abort();
  }
  KQuantRepackArgs args{};
  for (int i = 0; i < n_jobs; ++i) {
    const bool block_of_32 =
        type == kDevQ4_0 || type == kDevIQ4_NL || type == kDevQ5_0 || type == kDevQ4_1 || type == kDevQ5_1;
    if (jobs[i].bytes % block_bytes != 0 || jobs[i].cols % (block_of_32 ? kTable4Block : kKBlock) != 0) {
      std::fprintf(stderr, "repack (k-quant): job %d of %lld bytes, %lld cols\n", i,
                   static_cast<long long>(jobs[i].bytes), static_cast<long long>(jobs[i].cols));
      std::abort();
    }
    args.jobs[i] = jobs[i];
  }
  const dim3 grid(64, n_jobs);
  switch (type) {
    case kDevQ2_K:
      RepackKQuantKernel<kDevQ2_K><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevQ3_K:
      RepackKQuantKernel<kDevQ3_K><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevQ4_K:
      RepackKQuantKernel<kDevQ4_K><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevQ5_K:
      RepackKQuantKernel<kDevQ5_K><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevQ6_K:
      RepackKQuantKernel<kDevQ6_K><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevIQ4_XS:
      RepackKQuantKernel<kDevIQ4_XS><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevIQ2_XXS:
      RepackKQuantKernel<kDevIQ2_XXS><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevIQ2_XS:
      RepackKQuantKernel<kDevIQ2_XS><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevIQ3_XXS:
      RepackKQuantKernel<kDevIQ3_XXS><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevIQ3_S:
      RepackKQuantKernel<kDevIQ3_S><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevIQ2_S:
      RepackKQuantKernel<kDevIQ2_S><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevIQ1_S:
      RepackKQuantKernel<kDevIQ1_S><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevQ5_0:
      RepackKQuantKernel<kDevQ5_0><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevQ4_1:
      RepackKQuantKernel<kDevQ4_1><<<grid, 256, 0, stream>>>(args);
      break;
    case kDevQ5_1:
      RepackKQuantKernel<kDevQ5_1><<<grid, 256, 0, stream>>>(args);
      break;
    default:  // Q4_0 and IQ4_NL share one layout
      RepackKQuantKernel<kDevQ4_0><<<grid, 256, 0, stream>>>(args);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace mer::cuda
