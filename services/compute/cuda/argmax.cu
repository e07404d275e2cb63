#include "services/compute/cuda/argmax.cuh"

#include <cmath>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 1024;

// A candidate: the largest non-NaN value seen and its lowest index; index -1: none yet.
struct Best {
  float v;
  int64_t i;
};

__device__ inline Best Better(Best a, Best b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
}

// One block per row. Each thread scans indices tid, tid + kThreads, ... in order, keeping the first
// strictly larger non-NaN value (the lowest index of its largest); then the block picks the
// largest of those, the lowest index on ties: the lowest index of the row's largest non-NaN value.
__global__ void __launch_bounds__(kThreads) ArgmaxRowsKernel(const float* logits, int64_t n, int32_t* ids) {
  AllowDependents();
  WaitForPredecessor();
  const float* row = logits + int64_t(blockIdx.x) * n;
  Best best{0.0f, -1};
#pragma unroll 8
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = row[i];
    if (!isnan(v) && (best.i < 0 || v > best.v)) best = {v, i};
  }
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_down_sync(0xffffffffu, best.v, o), __shfl_down_sync(0xffffffffu, best.i, o)};
    best = Better(best, other);
  }
  __shared__ Best warp_best[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp != 0) return;
  best = warp_best[lane];  // kThreads / 32 == 32 warps
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_down_sync(0xffffffffu, best.v, o), __shfl_down_sync(0xffffffffu, best.i, o)};
    best = Better(best, other);
  }
  if (lane == 0) ids[blockIdx.x] = isnan(row[0]) || best.i < 0 ? 0 : static_cast<int32_t>(best.i);
}

}  // namespace

void LaunchArgmaxRows(const float* logits, int n_rows, int64_t n, int32_t* ids, cudaStream_t stream) {
  if (n_rows == 0) return;
  LaunchPdl(ArgmaxRowsKernel, dim3(n_rows), dim3(kThreads), 0, stream, logits, n, ids);
}

}  // namespace mer::cuda
