#include "services/compute/cuda/argmax.cuh"

#include <cmath>
#include <cstdio>
#include <cstdlib>

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

__device__ inline Best WarpBest(Best best) {
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_down_sync(0xffffffffu, best.v, o), __shfl_down_sync(0xffffffffu, best.i, o)};
    best = Better(best, other);
  }
  return best;  // in lane 0
}

// Block (c, r) scans chunk c of row r: each thread indices begin + tid, begin + tid + kThreads, ...
// in order, keeping the first strictly larger non-NaN value (the lowest index of its largest);
// then the block picks the largest of those, the lowest index on ties. The last block of the row
// does the same over the chunks' candidates (Better orders (value, -index) totally, so the order
// of the candidates does not matter): the lowest index of the row's largest non-NaN value.
__global__ void __launch_bounds__(kThreads)
    ArgmaxRowsKernel(const float* logits, int64_t n, int32_t* ids, Best* partial, unsigned* tickets) {
  __shared__ Best warp_best[kThreads / 32];
  __shared__ bool last;
  AllowDependents();
  WaitForPredecessor();
  const int r = blockIdx.y, chunk = blockIdx.x;
  const float* row = logits + int64_t(r) * n;
  const int64_t per = (n + kArgmaxChunks - 1) / kArgmaxChunks;
  const int64_t begin = chunk * per, end = min(n, begin + per);
  Best best{0.0f, -1};
#pragma unroll 8
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const float v = row[i];
    if (!isnan(v) && (best.i < 0 || v > best.v)) best = {v, i};
  }
  best = WarpBest(best);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_best[warp] = best;
  __syncthreads();
  if (warp != 0) return;
  best = WarpBest(warp_best[lane]);  // kThreads / 32 == 32 warps
  if (lane == 0) {
    partial[r * kArgmaxChunks + chunk] = best;
    __threadfence();
    last = atomicAdd(tickets + r, 1u) == kArgmaxChunks - 1;
  }
  __syncwarp();
  if (!last) return;
  __threadfence();
  Best candidate{0.0f, -1};
  if (lane < kArgmaxChunks) {
    const Best* p = partial + r * kArgmaxChunks + lane;
    candidate = {__ldcg(&p->v), static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(&p->i)))};
  }
  best = WarpBest(candidate);
  if (lane == 0) {
    tickets[r] = 0;  // ready for the next launch (graph replays reuse it)
    ids[r] = isnan(row[0]) || best.i < 0 ? 0 : static_cast<int32_t>(best.i);
  }
}

}  // namespace

void LaunchArgmaxRows(const float* logits, int n_rows, int64_t n, int32_t* ids, void* scratch, int max_rows,
                      cudaStream_t stream) {
  if (n_rows == 0) return;
  static_assert(kArgmaxChunks <= 32 && sizeof(Best) == 16, "ArgmaxScratchBytes: a warp's candidates of 16 bytes");
  if (n_rows > max_rows) {
    std::fprintf(stderr, "argmax: %d rows, scratch for %d\n", n_rows, max_rows);
    std::abort();
  }
  Best* partial = static_cast<Best*>(scratch);
  unsigned* tickets = reinterpret_cast<unsigned*>(partial + int64_t(max_rows) * kArgmaxChunks);
  LaunchPdl(ArgmaxRowsKernel, dim3(kArgmaxChunks, n_rows), dim3(kThreads), 0, stream, logits, n, ids, partial, tickets);
}

}  // namespace mer::cuda
