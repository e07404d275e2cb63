// The model identity both sides of a segment agree on for an expert store: mer-residency puts it
// in the header, the compute side expects it when attaching. Part of the shared-memory protocol
// (docs/shm_protocol.md), header-only so either side can use it without linking the other.
#pragma once

#include <cstdint>

#include "common/shm/layout.h"
#include "common/store/manifest.h"

namespace mer::shm {

// Fingerprint of every blob (BlobTableCrc) and of dense.gguf's header, and the blob size.
inline uint64_t StoreSegmentIdentity(const StoreManifest& m) {
  const uint64_t id = (uint64_t{BlobTableCrc(m)} << 32) ^ m.dense.header_crc ^ (m.blob_bytes << 7);
  return id == 0 ? 1 : id;
}

inline ExpectedIdentity ExpectedSegmentIdentity(const StoreManifest& m) {
  ExpectedIdentity e;
  e.model_identity = StoreSegmentIdentity(m);
  e.n_layer = m.n_layer;
  e.n_expert = m.n_expert;
  return e;
}

}  // namespace mer::shm
