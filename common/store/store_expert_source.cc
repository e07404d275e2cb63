#include "common/store/store_expert_source.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer {

absl::Status StoreExpertSource::AcquireLayer(int layer, absl::Span<const int32_t> experts,
                                             absl::Span<ExpertWeights> out) {
  if (layer < 0 || layer >= store_.n_layer())
    return absl::InvalidArgumentError(absl::StrCat("StoreExpertSource: layer ", layer, " out of range"));
  std::vector<AlignedBuffer>& held = held_[layer];
  for (size_t i = 0; i < experts.size(); ++i) {
    const int32_t e = experts[i];
    if (e < 0 || e >= store_.n_expert())
      return absl::InvalidArgumentError(
          absl::StrCat("StoreExpertSource: expert ", e, " of layer ", layer, " out of range"));
    AlignedBuffer buf;
    if (free_.empty()) {
      buf = AllocateAligned(store_.blob_bytes());
    } else {
      buf = std::move(free_.back());
      free_.pop_back();
    }
    const absl::Status s = store_.ReadBlob(layer, e, buf.get());
    if (!s.ok()) {
      free_.push_back(std::move(buf));
      return s;
    }
    ++blobs_read_;
    out[i] = store_.ExpertView(layer, e, buf.get());
    held.push_back(std::move(buf));
  }
  return absl::OkStatus();
}

std::optional<ExpertTypes> StoreExpertSource::expert_types(int layer) const {
  const StoreLayer& l = store_.manifest().layers[layer];
  return ExpertTypes{l.gate_type, l.up_type, l.down_type};
}

void StoreExpertSource::ReleaseLayer(int layer) {
  auto it = held_.find(layer);
  if (it == held_.end()) return;
  for (AlignedBuffer& b : it->second) free_.push_back(std::move(b));
  held_.erase(it);
}

}  // namespace mer
