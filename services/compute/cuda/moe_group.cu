#include "services/compute/cuda/moe_group.cuh"

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kMaxExperts = 1024;

__global__ void __launch_bounds__(kThreads)
    MoeGroupKernel(const int32_t* chosen, int n_pairs, int n_expert, const int32_t* slot_table, MoeGroups g) {
  static_assert(kMaxExperts <= kThreads, "a thread per expert");
  __shared__ int count[kMaxExperts];
  __shared__ int fill[kMaxExperts];
  __shared__ bool missing_slot[kMaxExperts];
  AllowDependents();
  WaitForPredecessor();
  // The slot table into shared memory in parallel: read entry by entry by one thread, every
  // entry would be an L2 round trip of its own (~50 us per layer for 128 experts).
  for (int e = threadIdx.x; e < n_expert; e += kThreads) {
    count[e] = 0;
    missing_slot[e] = slot_table[e] < 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_pairs; i += kThreads) atomicAdd(&count[chosen[i]], 1);
  __syncthreads();
  // The used experts in order of decreasing pair count, ties by id: the expert kernels' blocks
  // start in grid order, so those of the experts with the most pairs (the longest) start first
  // instead of forming the launch's tail. Thread e ranks expert e (n_expert <= kThreads).
  const int e = threadIdx.x;
  const bool used = e < n_expert && count[e] > 0;
  if (used) {
    const int ce = count[e];
    int rank = 0, offset = 0;
    for (int f = 0; f < n_expert; ++f) {
      const int cf = count[f];
      const bool before = cf > ce || (cf == ce && f < e);  // cf > 0 either way
      rank += before;
      offset += before ? cf : 0;
    }
    fill[e] = offset;
    g.used[rank] = e;
    g.begin[rank] = offset;
  }
  const int n_used = __syncthreads_count(used);
  const int n_missing = __syncthreads_count(used && missing_slot[e]);
  if (threadIdx.x == 0) {
    g.begin[n_used] = n_pairs;
    *g.n_used = n_used;
    *g.n_missing = n_missing;
    *g.lookups_total += static_cast<unsigned long long>(n_used);
  }
  for (int i = threadIdx.x; i < n_pairs; i += kThreads) g.pairs[atomicAdd(&fill[chosen[i]], 1)] = i;
}

}  // namespace

void LaunchMoeGroup(const int32_t* chosen, int n_pairs, int n_expert, const int32_t* slot_table,
                    const MoeGroups& groups, cudaStream_t stream) {
  LaunchPdl(MoeGroupKernel, dim3(1), dim3(kThreads), 0, stream, chosen, n_pairs, n_expert, slot_table, groups);
}

}  // namespace mer::cuda
