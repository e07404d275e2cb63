// The start of an expert-parallel rank's MoE layer (expert_parallel.h): zeros the layer's pair
// outputs, so that the pairs another rank runs add nothing to the ranks' sum, and counts what this
// rank runs from the layer's routing: counts->pairs += its pairs (experts e with e mod n_ranks ==
// rank), counts->lookups += its distinct experts, counts->busiest_rank_pairs += the pairs of the
// rank with the most (the same on every rank). chosen: int32 [n_pairs], ids in [0, n_expert);
// out: f32 [n_pairs, n_embd]. n_expert <= 1024, 1 <= n_ranks <= kRankLayerMaxRanks, n_embd a
// multiple of 4.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

inline constexpr int kRankLayerMaxRanks = 64;

struct RankCounts {
  unsigned long long pairs;
  unsigned long long lookups;
  unsigned long long busiest_rank_pairs;
};

void LaunchRankLayerStart(const int32_t* chosen, int n_pairs, int n_expert, int n_ranks, int rank, float* out,
                          int64_t n_embd, RankCounts* counts, cudaStream_t stream);

}  // namespace mer::cuda
