// The timing build's log (pdl.cuh, MER_TIMELINE): allocated at the engine's creation, written to
// $MER_TIMELINE_OUT as CSV when the engine goes.
#include "services/compute/cuda/timeline.h"

#if MER_TIMELINE
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "services/compute/cuda/cuda_check.cuh"

namespace mer::cuda {
namespace {

std::vector<void (*)(const TimelineLog&)>& Setters() {
  static std::vector<void (*)(const TimelineLog&)> setters;
  return setters;
}
TimelineLog log_on_device;

}  // namespace

void RegisterTimelineSetter(void (*set)(const TimelineLog&)) { Setters().push_back(set); }

void TimelineStart() {
  if (log_on_device.entries != nullptr) return;
  // 512 MB: ~150 decode steps of the 30B geometry (~110,000 blocks each).
  log_on_device.capacity = 1u << 24;
  CUDA_CHECK(cudaMalloc(&log_on_device.entries, sizeof(TimelineEntry) * log_on_device.capacity));
  CUDA_CHECK(cudaMalloc(&log_on_device.count, sizeof(unsigned)));
  CUDA_CHECK(cudaMemset(log_on_device.count, 0, sizeof(unsigned)));
  for (auto* set : Setters()) set(log_on_device);
}

void TimelineWrite() {
  const char* path = std::getenv("MER_TIMELINE_OUT");
  if (log_on_device.entries == nullptr || path == nullptr) return;
  CUDA_CHECK(cudaDeviceSynchronize());
  unsigned n = 0;
  CUDA_CHECK(cudaMemcpy(&n, log_on_device.count, sizeof n, cudaMemcpyDeviceToHost));
  n = std::min(n, log_on_device.capacity);
  std::vector<TimelineEntry> e(n);
  CUDA_CHECK(cudaMemcpy(e.data(), log_on_device.entries, sizeof(TimelineEntry) * n, cudaMemcpyDeviceToHost));
  std::sort(e.begin(), e.end(),
            [](const TimelineEntry& a, const TimelineEntry& b) { return a.return_ns < b.return_ns; });
  FILE* f = std::fopen(path, "w");
  if (f == nullptr) return;
  std::fprintf(f, "grid,block,smid,reach_ns,return_ns\n");
  for (const TimelineEntry& x : e)
    std::fprintf(f, "%llu,%u,%u,%llu,%llu\n", x.grid, x.block, x.smid, x.reach_ns, x.return_ns);
  std::fclose(f);
  std::fprintf(stderr, "timeline: %u blocks' waits written to %s\n", n, path);
}

}  // namespace mer::cuda
#else
namespace mer::cuda {
void RegisterTimelineSetter(void (*)(const TimelineLog&)) {}
void TimelineStart() {}
void TimelineWrite() {}
}  // namespace mer::cuda
#endif
