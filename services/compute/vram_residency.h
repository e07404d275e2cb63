// The seam between the cuda backend and mer-residency for the VRAM tier when the arena is exported
// through CUDA IPC (docs/cuda.md, "The arena over CUDA IPC"): compute allocates the arena and
// exports it; mer-residency decides which expert lives in which slot and uploads it; compute pins
// the slots a pass reads and converts a slot's fresh bytes to its device layout once per fill.
// Implemented by ResidencyExpertSource (the shm client); no CUDA types here.
//
// Thread-safety: one thread (the engine's Forward).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mer {

// The exported arena: slot_count slots of slot_bytes at the allocation cudaIpcGetMemHandle names.
struct VramArenaDescriptor {
  std::array<uint8_t, 64> ipc_handle{};  // cudaIpcMemHandle_t
  std::string pci_bus_id;                // of the device (cudaDeviceGetPCIBusId)
  uint64_t slot_bytes = 0;
  uint32_t slot_count = 0;
};

// Where gate, up and down lie in the bytes mer-residency copies into a slot (the store blob's
// first `bytes` bytes), before compute converts them to its device layout.
struct RawExpertOffsets {
  uint64_t gate = 0, up = 0, down = 0;
  uint64_t bytes = 0;
};

// An expert of an acquire: its slot, and whether the slot holds a fill compute has not converted
// yet (the caller converts it before any kernel reads the slot; the next acquire of the same fill
// says false).
struct VramPlacement {
  int32_t slot = -1;
  bool fresh = false;
};

class VramResidency {
 public:
  virtual ~VramResidency() = default;
  // The most slots an arena may have (the segment's VRAM pins).
  virtual uint32_t max_vram_slots() const = 0;
  virtual RawExpertOffsets raw_offsets(int layer) const = 0;
  // Publishes the arena and waits until mer-residency imported it (again after every
  // re-attachment). mer-residency's code when it refuses it (e.g. Unimplemented: built without
  // CUDA), Unavailable/DeadlineExceeded when it does not answer.
  virtual absl::Status ExportArena(const VramArenaDescriptor& arena) = 0;
  // Before the arena's memory is freed: mer-residency closes it (and forgets its placements).
  virtual void WithdrawArena() = 0;
  // Makes experts[i] of `layer` resident in the arena and pins their slots until ReleaseVram;
  // writes out[i]. Returns how many had to be demanded (were not in VRAM). Errors as
  // ResidencyClient::Acquire; nothing stays pinned then.
  virtual absl::StatusOr<int> AcquireVram(int layer, absl::Span<const int32_t> experts,
                                          absl::Span<VramPlacement> out) = 0;
  // Unpins everything acquired since the last call: call only after the GPU work that reads those
  // slots has completed (a synchronisation).
  virtual void ReleaseVram() = 0;
  // Best effort: the experts `layer` routed to (predicted = false), or those predicted for it with
  // confidence[i] in 0..255, which mer-residency may move into VRAM ahead of demand.
  virtual void HintVram(int layer, absl::Span<const int32_t> experts, absl::Span<const uint8_t> confidence,
                        bool predicted) = 0;

  // Long-lived pins, for an engine that publishes experts in its own device slot table for as
  // long as it likes (the device decides hits; docs/cuda.md "Misses decided on the device"):
  // PinVram is AcquireVram whose pins outlast ReleaseVram, each held until UnpinVram of that
  // expert (or until a re-attachment to a new mer-residency voids them all: attachment() then
  // changes, and the caller must forget every placement it published).
  virtual absl::StatusOr<int> PinVram(int layer, absl::Span<const int32_t> experts, absl::Span<VramPlacement> out) = 0;
  virtual void UnpinVram(int layer, int32_t expert) = 0;
  // Counts the attachments to a mer-residency (1 after Connect).
  virtual uint64_t attachment() const = 0;
};

}  // namespace mer
