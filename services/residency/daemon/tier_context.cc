#include "services/residency/daemon/tier_context.h"

#include <algorithm>
#include <optional>

#include "services/residency/daemon/ram_tier.h"
#include "services/residency/daemon/vram_tier.h"

namespace mer::residency {

TierContext::TierContext(const ExpertStore& store, shm::ShmSegment* segment, const Clock& clock)
    : store(store),
      segment(segment),
      ep(segment),
      clock(clock),
      n_layer(segment->header().n_layer),
      n_expert(segment->header().n_expert) {}

void TierContext::Complete(const shm::DemandRequest& d, uint32_t slot, uint64_t generation, absl::StatusCode code,
                           int64_t arrival_ns, shm::Pool pool) {
  shm::Completion done{};
  done.layer = d.layer;
  done.expert = d.expert;
  done.request_id = d.request_id;
  done.generation = generation;
  done.slot = slot;
  done.status = static_cast<uint16_t>(code);
  done.pool = static_cast<uint8_t>(pool);
  out_.push_back(done);
  out_arrival_ns_.push_back(arrival_ns);
}

void TierContext::FlushCompletions() {
  while (!out_.empty()) {
    shm::Completion buf[64];
    const size_t n = std::min<size_t>(out_.size(), 64);
    std::copy(out_.begin(), out_.begin() + n, buf);
    const size_t k = ep.completions().TryPushBatch(absl::MakeConstSpan(buf, n));
    out_.erase(out_.begin(), out_.begin() + k);
    c.completions_sent += k;
    int64_t now_ns = 0;
    for (size_t j = 0; j < k; ++j) {
      const int64_t arrival = out_arrival_ns_[j];
      if (arrival == 0) continue;
      if (now_ns == 0) now_ns = clock.NowNanos();
      c.stall_ns_total += static_cast<uint64_t>(std::max<int64_t>(0, now_ns - arrival));
      ++c.stalled_completions;
    }
    out_arrival_ns_.erase(out_arrival_ns_.begin(), out_arrival_ns_.begin() + k);
    if (k < n) break;  // ring full: the rest next turn
  }
}

uint64_t TierContext::PublishEntry(uint32_t index) {
  return ep.PublishResident(LayerOf(index), ExpertOf(index), ram->resident_slot(index), vram->resident_slot(index),
                            vram->fill(index), ram->device_layout(index), vram->converted(index));
}

uint64_t TierContext::ResidentGeneration(uint32_t index, shm::Pool pool, uint32_t slot) {
  const std::optional<shm::EntryState> s = ep.table().Read(LayerOf(index), ExpertOf(index));
  if (s.has_value() && s->in(pool) && (pool == shm::Pool::kRam ? s->ram_slot : s->vram_slot) == slot)
    return s->generation;
  return PublishEntry(index);
}

bool TierContext::DemandWaiting() {
  return ram->loads_queued() || vram->uploads_queued() || ep.demand().SizeApprox() > 0;
}

}  // namespace mer::residency
