#include "services/compute/cuda/published_experts.h"

#include <algorithm>

#include "common/base/check.h"

namespace mer::cuda {

PublishedExperts::PublishedExperts(int n_layer, int n_expert, ArenaPolicy policy, int64_t capacity)
    : n_layer_(n_layer),
      n_expert_(n_expert),
      policy_(policy),
      halve_every_(16 * std::max<int64_t>(capacity > 0 ? capacity : int64_t(n_layer) * n_expert, 1)),
      table_(int64_t(n_layer) * n_expert, -1),
      last_use_(int64_t(n_layer) * n_expert, 0),
      uses_(int64_t(n_layer) * n_expert, 0) {}

void PublishedExperts::Used(int layer, const int32_t* experts, int n, uint32_t step) {
  CHECK(layer >= 0 && layer < n_layer_);
  for (int i = 0; i < n; ++i) {
    if (experts[i] < 0 || experts[i] >= n_expert_) continue;  // device data: checked, not trusted
    const int64_t key = Key(layer, experts[i]);
    last_use_[key] = step;
    if (uses_[key] < UINT32_MAX) ++uses_[key];
    if (++uses_since_halving_ >= halve_every_) {
      for (uint32_t& u : uses_) u >>= 1;
      uses_since_halving_ = 0;
    }
  }
}

void PublishedExperts::Publish(int layer, int expert, int32_t slot) {
  CHECK(layer >= 0 && layer < n_layer_ && expert >= 0 && expert < n_expert_);
  int32_t& s = table_[Key(layer, expert)];
  published_ += (slot >= 0) - (s >= 0);
  s = slot;
}

void PublishedExperts::Clear() {
  std::fill(table_.begin(), table_.end(), -1);
  published_ = 0;
}

void PublishedExperts::ChooseRetirees(int n, int keep_layer, const int32_t* keep, int n_keep,
                                      std::vector<int64_t>* out) const {
  if (n <= 0) return;
  // The n of lowest rank, among the published ones outside `keep`: a bounded max-heap of
  // (rank, key) kept in `best` (O(published * log n); retirements are rare next to steps).
  std::vector<std::pair<uint64_t, int64_t>> best;
  best.reserve(n + 1);
  const int64_t keep_base = Key(keep_layer, 0);
  for (int64_t k = 0; k < static_cast<int64_t>(table_.size()); ++k) {
    if (table_[k] < 0) continue;
    if (k >= keep_base && k < keep_base + n_expert_ &&
        std::find(keep, keep + n_keep, static_cast<int32_t>(k - keep_base)) != keep + n_keep)
      continue;
    const std::pair<uint64_t, int64_t> c{Rank(k), k};
    if (static_cast<int>(best.size()) < n) {
      best.push_back(c);
      std::push_heap(best.begin(), best.end());
    } else if (c < best.front()) {
      std::pop_heap(best.begin(), best.end());
      best.back() = c;
      std::push_heap(best.begin(), best.end());
    }
  }
  std::sort(best.begin(), best.end());
  for (const auto& b : best) out->push_back(b.second);
}

}  // namespace mer::cuda
