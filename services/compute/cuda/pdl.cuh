// Programmatic dependent launch (Hopper): every kernel of the step is launched with LaunchPdl, so
// it may become resident while its predecessor on the stream is still running. Decode is a chain
// of 7 small kernels per layer (docs/cuda.md, "The step"), each of which would otherwise pay a
// launch ramp and a first DRAM round trip after the previous one drained; with PDL a mat-vec
// issues its weight loads (which depend on nothing) before it waits.
//
// The contract, for every kernel launched with LaunchPdl:
//   - AllowDependents() may come first (it lets the next kernel be scheduled; it orders nothing);
//   - WaitForPredecessor() must come before the first read of anything an earlier kernel of the
//     stream writes and before the first write of anything an earlier kernel reads. It returns
//     once the predecessor grid has completed and its writes are visible; since the predecessor
//     itself waited on its own predecessor, that covers every earlier kernel.
// Outside a PDL launch both are no-ops, so the kernels stay correct under any launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/timeline.h"

namespace mer::cuda {

#if MER_TIMELINE
// A timing build (-DMER_TIMELINE=ON): thread 0 of every block of every launch logs when it reached
// its wait and when the wait returned (%globaltimer, ns) with the launch's %gridid (a graph node
// keeps its id across replays), the block's index and its SM. The wait returns once the
// predecessor grid has completed, so consecutive launches' earliest returns give each kernel's
// time on the step's critical path; a block that reached its wait after that return was not
// resident in time (a second wave, or no room beside the kernels before it).
static __device__ TimelineLog timeline_log;  // one per translation unit, set by every SetTimelineLog

__device__ __forceinline__ unsigned long long GlobalTimerNs() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void WaitForPredecessor() {
  const unsigned long long reach = GlobalTimerNs();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0 || timeline_log.entries == nullptr) return;
  const unsigned long long ret = GlobalTimerNs();
  unsigned long long grid;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned i = atomicAdd(timeline_log.count, 1u);
  if (i < timeline_log.capacity) timeline_log.entries[i] = TimelineEntry{grid, reach, ret, block, smid};
}

namespace {
void SetTimelineLog(const TimelineLog& log) { CUDA_CHECK(cudaMemcpyToSymbol(timeline_log, &log, sizeof log)); }
const bool timeline_registered = (RegisterTimelineSetter(&SetTimelineLog), true);
}  // namespace
#else
__device__ __forceinline__ void WaitForPredecessor() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
#endif
__device__ __forceinline__ void AllowDependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

template <typename... KernelArgs, typename... Args>
void LaunchPdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
               Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace mer::cuda
