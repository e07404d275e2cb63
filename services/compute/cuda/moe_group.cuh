// Groups the (token, slot) pairs of a layer by expert, so each expert's weights are read once for
// all its tokens: used[0, *n_used) the distinct experts ascending, pairs[begin[u], begin[u + 1])
// the pair indices t * k + j routed to used[u] (in no particular order: pairs are independent).
// Also adds *n_used to *lookups_total, and counts into *n_missing the used experts whose slot_table entry is -1 (not in the arena).
// chosen: int32 [n_pairs]; n_expert <= 1024.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

struct MoeGroups {
  int32_t* n_used;                    // [1]
  int32_t* n_missing;                 // [1]
  int32_t* used;                      // [n_expert]
  int32_t* begin;                     // [n_expert + 1]
  int32_t* pairs;                     // [n_pairs]
  unsigned long long* lookups_total;  // [1] += *n_used (expert lookups, for the hit rate)
};

void LaunchMoeGroup(const int32_t* chosen, int n_pairs, int n_expert, const int32_t* slot_table,
                    const MoeGroups& groups, cudaStream_t stream);

}  // namespace mer::cuda
