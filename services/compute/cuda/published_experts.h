// What the device path's slot table publishes (docs/cuda.md, "Misses decided on the device"): the
// host's copy of the table (int32 [n_layer, n_expert], slot or -1), the last step that used each
// published expert, and the choice of which to retire when mer-residency needs unpinned slots to
// place the misses of a layer. Plain host bookkeeping (no CUDA), unit-tested in every build.
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

class PublishedExperts {
 public:
  PublishedExperts(int n_layer, int n_expert);

  int n_layer() const { return n_layer_; }
  int n_expert() const { return n_expert_; }
  int32_t slot(int layer, int expert) const { return table_[Key(layer, expert)]; }
  // The host copy of the table, row-major; row `layer` starts at row(layer).
  int32_t* row(int layer) { return table_.data() + int64_t(layer) * n_expert_; }
  int64_t published() const { return published_; }

  // A step used the experts (its routing record): remembered for the retirement order.
  void Used(int layer, const int32_t* experts, int n, uint32_t step);
  // Records (layer, expert) -> slot (a placement the engine pinned), or back to -1.
  void Publish(int layer, int expert, int32_t slot);
  void Unpublish(int layer, int expert) { Publish(layer, expert, -1); }
  void Clear();

  // Up to `n` published experts to retire, least recently used first, none of them among
  // `keep` (the experts of `keep_layer` the waiting step needs). Appends (layer, expert) keys
  // (layer * n_expert + expert) to *out.
  void ChooseRetirees(int n, int keep_layer, const int32_t* keep, int n_keep, std::vector<int64_t>* out) const;

 private:
  int64_t Key(int layer, int expert) const { return int64_t(layer) * n_expert_ + expert; }

  const int n_layer_, n_expert_;
  std::vector<int32_t> table_;      // [n_layer * n_expert]: slot or -1
  std::vector<uint32_t> last_use_;  // [n_layer * n_expert]: the last step that used it (0: none)
  int64_t published_ = 0;
};

}  // namespace mer::cuda
