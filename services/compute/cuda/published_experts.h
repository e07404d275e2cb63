// What the device path's slot table publishes (docs/cuda.md, "Misses decided on the device"): the
// host's copy of the table (int32 [n_layer, n_expert], slot or -1), every expert's uses, and the
// choice of which to retire when mer-residency needs unpinned slots to place the misses of a
// layer. Plain host bookkeeping (no CUDA), unit-tested in every build.
//
// Retirement order (ArenaPolicy): least recently used, or least frequently used with ageing (the
// default). LFU counts the steps that used each expert, published or not, so an expert that comes
// back resumes its count; every `halve_every` uses all counts are halved, so what was popular long
// ago gives way to what is popular now; among equal counts the least recently used goes first.
// Routing that draws experts from a skewed popularity (the qwen3moe models measured) keeps more
// of the next tokens' experts resident under LFU: on the Qwen3-30B-A3B geometry's trace an arena
// of 25% of the experts misses a third less often than under LRU (docs/benchmarks.md).
//
// Every published expert is pinned in mer-residency (VramResidency::PinVram): mer-residency may
// overwrite only slots the engine has retired. Retiring is safe while the device waits at a
// layer's gate: every kernel before the wait has completed, and every one after it reads the
// table rows uploaded before the gate opens.
//
// Thread-safety: one thread (the miss service).
#pragma once

#include <cstdint>
#include <vector>

namespace mer::cuda {

enum class ArenaPolicy { kLru, kLfu };

class PublishedExperts {
 public:
  // `capacity`: the arena's slots; LFU halves its counts every 16 x capacity uses.
  PublishedExperts(int n_layer, int n_expert, ArenaPolicy policy = ArenaPolicy::kLfu, int64_t capacity = 0);

  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  int32_t slot(int layer, int expert) const { return table_[Key(layer, expert)]; }
  // The host copy of the table, row-major; row `layer` starts at row(layer).
  int32_t* row(int layer) { return table_.data() + int64_t(layer) * n_expert_; }
  int64_t published() const { return published_; }

  // A step used the experts (its routing record): remembered for the retirement order.
  void Used(int layer, const int32_t* experts, int n, uint32_t step);
  // An expert's use count (LFU; aged), for tests.
  uint32_t uses(int layer, int expert) const { return uses_[Key(layer, expert)]; }
  // Records (layer, expert) -> slot (a placement the engine pinned), or back to -1.
  void Publish(int layer, int expert, int32_t slot);
  void Unpublish(int layer, int expert) { Publish(layer, expert, -1); }
  void Clear();

  // Up to `n` published experts to retire, first to go first (the policy's order), none of them
  // among `keep` (the experts of `keep_layer` the waiting step needs). Appends (layer, expert)
  // keys (layer * n_expert + expert) to *out.
  void ChooseRetirees(int n, int keep_layer, const int32_t* keep, int n_keep, std::vector<int64_t>* out) const;

 private:
  int64_t Key(int layer, int expert) const { return int64_t(layer) * n_expert_ + expert; }
  // Lower retires first.
  uint64_t Rank(int64_t key) const {
    return policy_ == ArenaPolicy::kLfu ? uint64_t(uses_[key]) << 32 | last_use_[key] : last_use_[key];
  }

  const int n_layer_, n_expert_;
  const ArenaPolicy policy_;
  const int64_t halve_every_;
  std::vector<int32_t> table_;      // [n_layer * n_expert]: slot or -1
  std::vector<uint32_t> last_use_;  // [n_layer * n_expert]: the last step that used it (0: none)
  std::vector<uint32_t> uses_;      // [n_layer * n_expert]: steps that used it, halved every halve_every_ uses
  int64_t uses_since_halving_ = 0;
  int64_t published_ = 0;
};

}  // namespace mer::cuda
