// The cuda backend's side of the arena exported through CUDA IPC (docs/cuda.md, "The arena over
// CUDA IPC"): exports the arena CudaEngine allocated to mer-residency (VramResidency), acquires a
// pass's experts into it, converts fresh fills to the device layout in place, and keeps the
// look-ahead's measured precision as the confidence of its predicted hints.
//
// Who writes a slot: mer-residency copies an expert's raw blob bytes into a slot only while no
// step has it pinned; compute converts it (slot -> staging -> repack into the slot) only while it
// holds the pin, and releases pins only after a synchronisation that saw every kernel reading
// them. So the two never touch a slot at the same time.
//
// Internal to services/compute/cuda (it shows cudaStream_t's struct, not the runtime header).
// Thread-safety: one thread at a time: the engine's Forward on the host path (Acquire, Release,
// the hints), or the miss service's thread on the device path (Place, Unpin, the hints); an engine
// takes one path for its lifetime, and Release does nothing where nothing was acquired.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/compute/cuda/expert_layout.h"
#include "services/compute/cuda/repack.cuh"
#include "services/compute/vram_residency.h"

struct CUstream_st;

namespace mer::cuda {

// One layer's expert matrices in a slot (the engine's layout, each matrix of its own type) and in
// the raw bytes.
struct VramLayerLayout {
  ExpertLayout slot;
  RawExpertOffsets raw;
};

struct ResidencyVramStats {
  int64_t acquires = 0;
  int64_t demanded = 0;        // experts not in VRAM when acquired (mer-residency uploaded them)
  int64_t converted = 0;       // fresh fills converted to the device layout
  int64_t predicted = 0;       // look-ahead predictions scored
  int64_t predicted_used = 0;  // of those, routed to by the layer they were made for
};

class ResidencyVram {
 public:
  // Exports [arena, arena + slot_count * slot_bytes) (the start of a cudaMalloc allocation on
  // `device`) and waits for mer-residency to import it. `staging` holds staging_slots slots of
  // slot_bytes for the conversion.
  static absl::StatusOr<std::unique_ptr<ResidencyVram>> Create(VramResidency& residency, int device, uint8_t* arena,
                                                               int64_t slot_bytes, int32_t slot_count,
                                                               std::vector<VramLayerLayout> layouts, uint8_t* staging,
                                                               int staging_slots);
  ~ResidencyVram();

  // Pins experts of `layer` in VRAM, writes their slots into table_row[expert] (the host slot
  // table's row of the layer) and enqueues on `stream` the conversion of fresh fills, which the
  // kernels launched after it on the stream see. Returns the experts that were demanded.
  absl::StatusOr<int> Acquire(int layer, absl::Span<const int32_t> experts, int32_t* table_row, CUstream_st* stream);
  // Acquire with long-lived pins (VramResidency::PinVram), for the miss service of the device
  // path: each expert stays pinned until Unpin. The conversions go on `stream` likewise.
  absl::StatusOr<int> Place(int layer, absl::Span<const int32_t> experts, int32_t* table_row, CUstream_st* stream);
  void Unpin(int layer, int32_t expert) { residency_.UnpinVram(layer, expert); }
  uint64_t attachment() const { return residency_.attachment(); }
  // After a synchronisation that saw every kernel reading the slots acquired.
  void Release();
  // The experts `layer` routed to; scores the last prediction made for it.
  void Routed(int layer, absl::Span<const int32_t> experts);
  // The look-ahead's prediction for `layer`, sent with the precision measured so far.
  void Predicted(int layer, absl::Span<const int32_t> experts);

  const ResidencyVramStats& stats() const { return stats_; }

 private:
  ResidencyVram(VramResidency& residency, uint8_t* arena, int64_t slot_bytes, std::vector<VramLayerLayout> layouts,
                uint8_t* staging, int staging_slots)
      : residency_(residency),
        arena_(arena),
        slot_bytes_(slot_bytes),
        layouts_(std::move(layouts)),
        staging_(staging),
        staging_slots_(staging_slots) {}

  // Writes table_row from placements_ and enqueues the conversion of the fresh fills on stream.
  void Convert(int layer, absl::Span<const int32_t> experts, int32_t* table_row, CUstream_st* stream);

  VramResidency& residency_;
  uint8_t* const arena_;
  const int64_t slot_bytes_;
  const std::vector<VramLayerLayout> layouts_;
  uint8_t* const staging_;
  const int staging_slots_;
  bool held_ = false;
  std::vector<VramPlacement> placements_;  // reserved at Create
  std::vector<int32_t> fresh_;
  std::vector<TypedRepackJob> repack_jobs_;  // one staging batch's, reserved at Create
  std::vector<int32_t> last_prediction_;
  std::vector<uint8_t> confidence_;
  int last_prediction_layer_ = -1;
  ResidencyVramStats stats_;
};

}  // namespace mer::cuda
