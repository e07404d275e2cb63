// The timing build's launch log (pdl.cuh, -DMER_TIMELINE=ON); no-ops in other builds.
#pragma once

namespace mer::cuda {

struct TimelineEntry {
  unsigned long long grid, reach_ns, return_ns;
  unsigned block, smid;
};
struct TimelineLog {
  TimelineEntry* entries = nullptr;
  unsigned* count = nullptr;
  unsigned capacity = 0;
};
// Each translation unit with kernels (pdl.cuh) registers how to hand its copy of the log pointer over.
void RegisterTimelineSetter(void (*set)(const TimelineLog&));

void TimelineStart();  // allocates the log and hands it to every translation unit's kernels
void TimelineWrite();  // writes it to $MER_TIMELINE_OUT (CSV: grid, block, smid, reach_ns, return_ns), if set

}  // namespace mer::cuda
