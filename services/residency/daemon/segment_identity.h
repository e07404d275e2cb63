// The model identity both sides of a segment agree on for an expert store: mer-residency puts it
// in the header, the compute side expects it when attaching (header-only so either side can use
// it without linking the other).
#pragma once

#include <cstdint>

#include "common/shm/layout.h"
#include "common/store/manifest.h"

namespace mer::residency {

// Fingerprint of every blob (BlobTableCrc) and of dense.gguf's header, and the blob size.
inline uint64_t SegmentIdentity(const StoreManifest& m) {
  const uint64_t id = (uint64_t{BlobTableCrc(m)} << 32) ^ m.dense.header_crc ^ (m.blob_bytes << 7);
  return id == 0 ? 1 : id;
}

inline shm::ExpectedIdentity ExpectedSegmentIdentity(const StoreManifest& m) {
  shm::ExpectedIdentity e;
  e.model_identity = SegmentIdentity(m);
  e.n_layer = m.n_layer;
  e.n_expert = m.n_expert;
  return e;
}

}  // namespace mer::residency
