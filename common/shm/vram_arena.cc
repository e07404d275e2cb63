#include "common/shm/vram_arena.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace mer::shm {
namespace {

absl::Status CheckInfo(uint64_t slot_bytes, uint32_t slot_count, uint32_t vram_slot_count) {
  if (slot_count < 1 || slot_count > vram_slot_count)
    return absl::InvalidArgumentError(absl::StrCat("vram arena: slot_count = ", slot_count, " outside [1, ",
                                                   vram_slot_count, "] (the segment's vram_slot_count)"));
  if (slot_bytes == 0 || slot_bytes % kVramSlotAlign != 0 || slot_bytes > kMaxVramSlotBytes)
    return absl::InvalidArgumentError(absl::StrCat("vram arena: slot_bytes = ", slot_bytes, " is not a multiple of ",
                                                   kVramSlotAlign, " in [", kVramSlotAlign, ", ", kMaxVramSlotBytes,
                                                   "]"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint64_t> WriteVramArena(VramArenaExport& x, const VramArenaInfo& info, uint32_t vram_slot_count) {
  if (absl::Status s = CheckInfo(info.slot_bytes, info.slot_count, vram_slot_count); !s.ok()) return s;
  if (info.pci_bus_id.size() >= kPciBusIdBytes)
    return absl::InvalidArgumentError(
        absl::StrCat("vram arena: pci_bus_id '", info.pci_bus_id, "' is longer than ", kPciBusIdBytes - 1));
  uint64_t bus[kPciBusIdBytes / 8] = {};
  std::memcpy(bus, info.pci_bus_id.data(), info.pci_bus_id.size());
  uint64_t handle[kIpcHandleBytes / 8];
  std::memcpy(handle, info.ipc_handle.data(), kIpcHandleBytes);

  // One writer; an odd value can only be a dead writer's (a compute killed mid-write).
  uint64_t s = x.sequence.load(std::memory_order_relaxed);
  s += s & 1;
  x.sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  x.compute_incarnation.store(info.compute_incarnation, std::memory_order_relaxed);
  x.slot_bytes.store(info.slot_bytes, std::memory_order_relaxed);
  x.slot_count.store(info.slot_count, std::memory_order_relaxed);
  for (uint32_t i = 0; i < kPciBusIdBytes / 8; ++i) x.pci_bus_id[i].store(bus[i], std::memory_order_relaxed);
  for (uint32_t i = 0; i < kIpcHandleBytes / 8; ++i) x.ipc_handle[i].store(handle[i], std::memory_order_relaxed);
  x.sequence.store(s + 2, std::memory_order_release);
  return s + 2;
}

uint64_t WithdrawVramArena(VramArenaExport& x, uint64_t compute_incarnation) {
  uint64_t s = x.sequence.load(std::memory_order_relaxed);
  s += s & 1;
  x.sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  x.compute_incarnation.store(compute_incarnation, std::memory_order_relaxed);
  x.slot_bytes.store(0, std::memory_order_relaxed);
  x.slot_count.store(0, std::memory_order_relaxed);
  x.sequence.store(s + 2, std::memory_order_release);
  return s + 2;
}

std::optional<VramArenaRead> ReadVramArena(const VramArenaExport& x, uint64_t compute_incarnation,
                                           uint32_t vram_slot_count) {
  const uint64_t s1 = x.sequence.load(std::memory_order_acquire);
  if (s1 == 0 || (s1 & 1) != 0) return std::nullopt;
  VramArenaInfo info;
  info.compute_incarnation = x.compute_incarnation.load(std::memory_order_relaxed);
  info.slot_bytes = x.slot_bytes.load(std::memory_order_relaxed);
  info.slot_count = x.slot_count.load(std::memory_order_relaxed);
  uint64_t bus[kPciBusIdBytes / 8];
  uint64_t handle[kIpcHandleBytes / 8];
  for (uint32_t i = 0; i < kPciBusIdBytes / 8; ++i) bus[i] = x.pci_bus_id[i].load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < kIpcHandleBytes / 8; ++i) handle[i] = x.ipc_handle[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (x.sequence.load(std::memory_order_relaxed) != s1) return std::nullopt;  // mid-write: later
  if (info.compute_incarnation != compute_incarnation) return std::nullopt;
  VramArenaRead r;
  r.sequence = s1;
  if (info.slot_count == 0 && info.slot_bytes == 0) {
    r.info = absl::NotFoundError("vram arena: withdrawn by compute");
    return r;
  }
  if (absl::Status s = CheckInfo(info.slot_bytes, info.slot_count, vram_slot_count); !s.ok()) {
    r.info = s;
    return r;
  }
  const char* b = reinterpret_cast<const char*>(bus);
  const size_t len = strnlen(b, kPciBusIdBytes);
  if (len == kPciBusIdBytes) {
    r.info = absl::InvalidArgumentError("vram arena: pci_bus_id is not NUL-terminated");
    return r;
  }
  info.pci_bus_id.assign(b, len);
  std::memcpy(info.ipc_handle.data(), handle, kIpcHandleBytes);
  r.info = std::move(info);
  return r;
}

void AckVramArena(VramArenaExport& x, uint64_t sequence, absl::StatusCode code) {
  x.import_status.store(static_cast<uint32_t>(code), std::memory_order_relaxed);
  x.imported_sequence.store(sequence, std::memory_order_release);
}

std::optional<absl::StatusCode> VramArenaAck(const VramArenaExport& x, uint64_t sequence) {
  if (x.imported_sequence.load(std::memory_order_acquire) != sequence) return std::nullopt;
  const uint32_t code = x.import_status.load(std::memory_order_relaxed);
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(code);
}

}  // namespace mer::shm
