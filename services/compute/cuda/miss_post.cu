#include "services/compute/cuda/miss_post.cuh"

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/routing_record.h"

namespace mer::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) MissPostKernel(const __grid_constant__ MissPostArgs a) {
  __shared__ unsigned long long position;
  AllowDependents();
  WaitForPredecessor();
  const int n_used = *a.groups.n_used;
  const int n_missing = *a.groups.n_missing;
  if (threadIdx.x == 0) position = (*a.record_head)++;
  __syncthreads();
  uint8_t* rec = a.ring + int64_t(position % a.ring_capacity) * a.record_bytes;
  volatile int32_t* used = RecordUsed(rec);
  for (int u = threadIdx.x; u < n_used; u += kThreads) used[u] = a.groups.used[u];
  const int n_pred = a.pred_chosen != nullptr ? a.k : 0;
  volatile int32_t* pred = RecordPred(rec, a.n_expert);
  for (int j = threadIdx.x; j < n_pred; j += kThreads) pred[j] = a.pred_chosen[j];
  if (threadIdx.x == 0) {
    volatile RoutingRecordHeader* h = reinterpret_cast<volatile RoutingRecordHeader*>(rec);
    h->layer = static_cast<uint32_t>(a.layer);
    h->step = *a.step;
    h->n_used = static_cast<uint32_t>(n_used);
    h->n_missing = static_cast<uint32_t>(n_missing);
    h->n_pred = static_cast<uint32_t>(n_pred);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the lists and fields before `ready`, for a reader on the host
    reinterpret_cast<volatile RoutingRecordHeader*>(rec)->ready = position + 1;
    __threadfence_system();
    // Every used expert resident: the layer goes on at once (the gate is device memory, read by
    // the stream's wait that follows this kernel).
    if (n_missing == 0) *a.gate = 1;
  }
}

}  // namespace

void LaunchMissPost(const MissPostArgs& args, cudaStream_t stream) {
  LaunchPdl(MissPostKernel, dim3(1), dim3(kThreads), 0, stream, args);
}

}  // namespace mer::cuda
