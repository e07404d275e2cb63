#include "services/compute/cuda/moe_group.cuh"

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kMaxExperts = 1024;

__global__ void __launch_bounds__(kThreads) MoeGroupKernel(const int32_t* chosen, int n_pairs, int n_expert,
                                                           const int32_t* slot_table, MoeGroups g) {
  __shared__ int count[kMaxExperts];
  __shared__ int fill[kMaxExperts];
  __shared__ bool missing_slot[kMaxExperts];
  AllowDependents();
  WaitForPredecessor();
  // The slot table into shared memory in parallel: read by thread 0's loop below, every entry
  // would be an L2 round trip of its own (~50 us per layer for 128 experts).
  for (int e = threadIdx.x; e < n_expert; e += kThreads) {
    count[e] = 0;
    missing_slot[e] = slot_table[e] < 0;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_pairs; i += kThreads) atomicAdd(&count[chosen[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int u = 0, offset = 0, missing = 0;
    for (int e = 0; e < n_expert; ++e) {
      if (count[e] == 0) continue;
      fill[e] = offset;
      g.used[u] = e;
      g.begin[u] = offset;
      offset += count[e];
      missing += missing_slot[e];
      ++u;
    }
    g.begin[u] = offset;
    *g.n_used = u;
    *g.n_missing = missing;
    *g.lookups_total += static_cast<unsigned long long>(u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_pairs; i += kThreads) g.pairs[atomicAdd(&fill[chosen[i]], 1)] = i;
}

}  // namespace

void LaunchMoeGroup(const int32_t* chosen, int n_pairs, int n_expert, const int32_t* slot_table,
                    const MoeGroups& groups, cudaStream_t stream) {
  LaunchPdl(MoeGroupKernel, dim3(1), dim3(kThreads), 0, stream, chosen, n_pairs, n_expert, slot_table, groups);
}

}  // namespace mer::cuda
