// The record the device writes for every layer of a step on the served path with a partial arena
// (miss_post.cuh), and the ring that carries it to the host: plain layout, no CUDA types, shared
// by the kernel that writes it and the miss service that reads it (and its unit test).
//
// Ring: capacity records of RecordBytes(n_expert, k) bytes, record p at (p % capacity). The
// device writes a record's fields, makes them visible system-wide (__threadfence_system), then
// stores `ready = p + 1`; a reader that sees ready == p + 1 (an acquire load) may read the rest.
// A reader more than `capacity` records behind finds newer records in the slots it expected: it
// skips to them (the lost records were hits only: a record with misses holds the device at its
// gate until it is served, so nothing overwrites it).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

// The layout helpers run on both sides (nvcc marks them for the device too).
#if defined(__CUDACC__)
#define MER_RECORD_FN __host__ __device__ inline
#else
#define MER_RECORD_FN inline
#endif

namespace mer::cuda {

struct RoutingRecordHeader {
  uint64_t ready;  // p + 1 once the record at position p is complete
  uint32_t layer;
  uint32_t step;       // the step's number (host-assigned, a step input)
  uint32_t n_used;     // distinct experts the layer routes to (used[0, n_used))
  uint32_t n_missing;  // of those, not in the arena: the layer's gate stays closed until served
  uint32_t n_pred;     // predicted experts of layer + 1 (pred[0, n_pred)), 0 if none
  uint32_t reserved;
  // int32 used[n_expert], then int32 pred[k], follow.
};
static_assert(sizeof(RoutingRecordHeader) == 32);

inline constexpr int32_t RoutingRecordBytes(int32_t n_expert, int32_t k) {
  const int32_t bytes = static_cast<int32_t>(sizeof(RoutingRecordHeader)) + 4 * (n_expert + k);
  return (bytes + 63) / 64 * 64;
}

// The expert lists of a record at `base`.
MER_RECORD_FN int32_t* RecordUsed(uint8_t* base) {
  return reinterpret_cast<int32_t*>(base + sizeof(RoutingRecordHeader));
}
MER_RECORD_FN int32_t* RecordPred(uint8_t* base, int32_t n_expert) { return RecordUsed(base) + n_expert; }

// A record copied out of the ring (the device may reuse its slot afterwards).
struct RoutingRecord {
  uint64_t position = 0;
  RoutingRecordHeader header{};
  std::vector<int32_t> used, pred;
};

// The host's reading end of the ring. Checks what the device wrote as untrusted (counts and
// layers out of range are dropped and counted).
class RoutingRecordReader {
 public:
  RoutingRecordReader(const uint8_t* ring, int32_t capacity, int32_t record_bytes, int32_t n_layer, int32_t n_expert,
                      int32_t k)
      : ring_(ring), capacity_(capacity), record_bytes_(record_bytes), n_layer_(n_layer), n_expert_(n_expert), k_(k) {}

  // The next complete record, copied into *out; false when the device has written none since.
  bool Next(RoutingRecord* out) {
    for (;;) {
      const uint8_t* rec = ring_ + int64_t(next_ % uint64_t(capacity_)) * record_bytes_;
      const uint64_t ready = reinterpret_cast<const volatile RoutingRecordHeader*>(rec)->ready;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (ready < next_ + 1) return false;  // not written yet (or an older lap's record)
      if (ready > next_ + 1) {              // a lap behind: what was here is gone (hits only, see above)
        skipped_ += ready - 1 - next_;
        next_ = ready - 1;
      }
      out->position = next_;
      std::memcpy(&out->header, rec, sizeof(RoutingRecordHeader));
      const RoutingRecordHeader& h = out->header;
      // A slot rewritten while it was copied would show another `ready` now: read it again.
      const bool bad = h.layer >= uint32_t(n_layer_) || h.n_used > uint32_t(n_expert_) || h.n_missing > h.n_used ||
                       h.n_pred > uint32_t(k_);
      if (!bad) {
        const int32_t* used = reinterpret_cast<const int32_t*>(rec + sizeof(RoutingRecordHeader));
        out->used.assign(used, used + h.n_used);
        out->pred.assign(used + n_expert_, used + n_expert_ + h.n_pred);
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      const uint64_t again = reinterpret_cast<const volatile RoutingRecordHeader*>(rec)->ready;
      if (again != ready) continue;
      ++next_;
      if (bad) {
        ++malformed_;
        continue;
      }
      return true;
    }
  }
  uint64_t position() const { return next_; }
  uint64_t skipped() const { return skipped_; }
  uint64_t malformed() const { return malformed_; }

 private:
  const uint8_t* ring_;
  const int32_t capacity_, record_bytes_, n_layer_, n_expert_, k_;
  uint64_t next_ = 0;
  uint64_t skipped_ = 0, malformed_ = 0;
};

}  // namespace mer::cuda
