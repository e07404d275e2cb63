// An ExpertSource that reads every requested expert from an expert store with pread into memory
// of its own and verifies its checksum: simple and synchronous, for tests and tools (the residency
// daemon has its own, asynchronous path to the same blobs).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/expert_source.h"
#include "common/store/expert_store.h"

namespace mer {

class StoreExpertSource final : public ExpertSource {
 public:
  explicit StoreExpertSource(const ExpertStore& store) : store_(store) {}

  // DataLoss naming the layer and expert when a blob fails its checksum; Unavailable for an I/O
  // error; InvalidArgument for an expert id out of range.
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override;
  void ReleaseLayer(int layer) override;
  std::optional<ExpertTypes> expert_types(int layer) const override;

  uint64_t blobs_read() const { return blobs_read_; }

 private:
  const ExpertStore& store_;
  std::vector<AlignedBuffer> free_;                 // blob buffers not in use
  std::map<int, std::vector<AlignedBuffer>> held_;  // layer -> buffers of its acquired experts
  uint64_t blobs_read_ = 0;
};

}  // namespace mer
