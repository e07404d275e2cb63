// Publication of the VRAM arena that mer-compute exports through CUDA IPC (VramArenaExport in
// layout.h; docs/shm_protocol.md, "The VRAM arena export").
//
// compute (one writer):   WriteVramArena: sequence = s + 1 (odd), fence(release), the fields
//                         (relaxed), sequence = s + 2 (release); then it waits until
//                         imported_sequence == s + 2 and reads import_status.
// residency (one reader): ReadVramArena: the seqlock read of residency_table.h; an export of
//                         another compute incarnation than the live one is ignored; the fields
//                         are validated as untrusted input. AckVramArena stores import_status
//                         (relaxed), then imported_sequence (release).
// Nothing here knows CUDA: the handle is 64 opaque bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shm/layout.h"

namespace mer::shm {

struct VramArenaInfo {
  uint64_t compute_incarnation = 0;
  uint64_t slot_bytes = 0;
  uint32_t slot_count = 0;
  std::string pci_bus_id;  // at most kPciBusIdBytes - 1 characters
  std::array<uint8_t, kIpcHandleBytes> ipc_handle{};
};

// compute: publishes `info` and returns the new (even) sequence. InvalidArgument (nothing
// written) when info does not fit the segment: slot_count outside [1, vram_slot_count], slot_bytes
// not a positive multiple of kVramSlotAlign up to kMaxVramSlotBytes, a bus id too long.
absl::StatusOr<uint64_t> WriteVramArena(VramArenaExport& x, const VramArenaInfo& info, uint32_t vram_slot_count);

// What residency read: the sequence (to acknowledge), and the export or why it is unusable.
struct VramArenaRead {
  uint64_t sequence = 0;
  absl::StatusOr<VramArenaInfo> info = VramArenaInfo{};
};
// compute: withdraws the arena (the memory is about to be freed): an export of no slots, which
// residency acknowledges (OK) after it closed the arena and cleared its placements.
uint64_t WithdrawVramArena(VramArenaExport& x, uint64_t compute_incarnation);

// residency: nullopt while nothing was exported, compute is writing (or died writing), or the
// export is of another compute incarnation than `compute_incarnation`. Otherwise the export,
// NotFound for a withdrawal, or InvalidArgument naming the bad field.
std::optional<VramArenaRead> ReadVramArena(const VramArenaExport& x, uint64_t compute_incarnation,
                                           uint32_t vram_slot_count);

// residency: the import of `sequence` is done (code OK) or refused (code says why).
void AckVramArena(VramArenaExport& x, uint64_t sequence, absl::StatusCode code);

// compute: whether residency has acted on `sequence`, and with what code.
std::optional<absl::StatusCode> VramArenaAck(const VramArenaExport& x, uint64_t sequence);

}  // namespace mer::shm
