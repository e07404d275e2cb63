#include "services/compute/cuda/rank_layer.cuh"

#include <algorithm>

#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxExperts = 1024;
constexpr int64_t kMaxBlocks = 1024;

__global__ void __launch_bounds__(kThreads)
    RankLayerStartKernel(const int32_t* chosen, int n_pairs, int n_expert, int n_ranks, int rank, float4* out,
                         int64_t n4, RankCounts* counts) {
  // The previous layer's combine reads out, the routing kernels write chosen.
  WaitForPredecessor();
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n4; i += int64_t(gridDim.x) * kThreads)
    out[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (blockIdx.x != 0) return;
  __shared__ int load[kRankLayerMaxRanks];
  __shared__ int held[kMaxExperts];
  for (int r = threadIdx.x; r < n_ranks; r += kThreads) load[r] = 0;
  for (int e = threadIdx.x; e < n_expert; e += kThreads) held[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < n_pairs; i += kThreads) {
    const int e = chosen[i];
    const int r = e % n_ranks;
    atomicAdd(&load[r], 1);
    if (r == rank) held[e] = 1;
  }
  __syncthreads();
  int distinct = 0;
  for (int e0 = 0; e0 < n_expert; e0 += kThreads)  // the same trip count on every thread
    distinct += __syncthreads_count(e0 + int(threadIdx.x) < n_expert && held[e0 + threadIdx.x] != 0);
  if (threadIdx.x != 0) return;
  int busiest = 0;
  for (int r = 0; r < n_ranks; ++r) busiest = max(busiest, load[r]);
  counts->pairs += static_cast<unsigned long long>(load[rank]);
  counts->lookups += static_cast<unsigned long long>(distinct);
  counts->busiest_rank_pairs += static_cast<unsigned long long>(busiest);
}

}  // namespace

void LaunchRankLayerStart(const int32_t* chosen, int n_pairs, int n_expert, int n_ranks, int rank, float* out,
                          int64_t n_embd, RankCounts* counts, cudaStream_t stream) {
  const int64_t n4 = int64_t(n_pairs) * n_embd / 4;
  const int64_t blocks = std::clamp<int64_t>((n4 + kThreads - 1) / kThreads, 1, kMaxBlocks);
  LaunchPdl(RankLayerStartKernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, chosen, n_pairs,
            n_expert, n_ranks, rank, reinterpret_cast<float4*>(out), n4, counts);
}

}  // namespace mer::cuda
