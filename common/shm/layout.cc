#include "common/shm/layout.h"

#include <cstring>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer::shm {
namespace {

constexpr uint64_t Fnv1a(std::initializer_list<uint64_t> values) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint64_t v : values) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  }
  return h;
}

#define MER_F(type, field) offsetof(type, field)

constexpr uint64_t kLayoutHash = Fnv1a({
    kProtocolVersion,
    kCacheLine,
    kPageBytes,
    kMaxStepsInFlight,
    kHintMaxExperts,
    kNoSlot,
    // SegmentHeader
    sizeof(SegmentHeader),
    MER_F(SegmentHeader, magic),
    MER_F(SegmentHeader, protocol_version),
    MER_F(SegmentHeader, header_bytes),
    MER_F(SegmentHeader, segment_bytes),
    MER_F(SegmentHeader, layout_hash),
    MER_F(SegmentHeader, model_identity),
    MER_F(SegmentHeader, n_layer),
    MER_F(SegmentHeader, n_expert),
    MER_F(SegmentHeader, demand_capacity),
    MER_F(SegmentHeader, hint_capacity),
    MER_F(SegmentHeader, completion_capacity),
    MER_F(SegmentHeader, ram_slot_count),
    MER_F(SegmentHeader, ram_slot_bytes),
    MER_F(SegmentHeader, vram_slot_count),
    MER_F(SegmentHeader, max_steps_in_flight),
    MER_F(SegmentHeader, created_unix_ns),
    MER_F(SegmentHeader, control_offset),
    MER_F(SegmentHeader, demand_ring_offset),
    MER_F(SegmentHeader, hint_ring_offset),
    MER_F(SegmentHeader, completion_ring_offset),
    MER_F(SegmentHeader, table_offset),
    MER_F(SegmentHeader, ram_pins_offset),
    MER_F(SegmentHeader, vram_pins_offset),
    MER_F(SegmentHeader, ram_pool_offset),
    // ProcessInfo, SegmentControl
    sizeof(ProcessInfo),
    MER_F(ProcessInfo, incarnation),
    MER_F(ProcessInfo, heartbeat_ns),
    MER_F(ProcessInfo, attach_ns),
    MER_F(ProcessInfo, pid_ns),
    MER_F(ProcessInfo, pid),
    MER_F(ProcessInfo, state),
    sizeof(SegmentControl),
    MER_F(SegmentControl, process),
    MER_F(SegmentControl, superseded),
    MER_F(SegmentControl, compute_epoch),
    MER_F(SegmentControl, step_epochs),
    MER_F(SegmentControl, vram_arena),
    // VramArenaExport
    sizeof(VramArenaExport),
    MER_F(VramArenaExport, sequence),
    MER_F(VramArenaExport, compute_incarnation),
    MER_F(VramArenaExport, slot_bytes),
    MER_F(VramArenaExport, slot_count),
    MER_F(VramArenaExport, pci_bus_id),
    MER_F(VramArenaExport, ipc_handle),
    MER_F(VramArenaExport, imported_sequence),
    MER_F(VramArenaExport, import_status),
    kMaxVramSlotBytes,
    kVramSlotAlign,
    // RingControl
    sizeof(RingControl),
    MER_F(RingControl, head),
    MER_F(RingControl, tail),
    MER_F(RingControl, data_futex),
    MER_F(RingControl, consumer_waiting),
    MER_F(RingControl, space_futex),
    MER_F(RingControl, producer_waiting),
    // ResidencyEntry, SlotPin
    sizeof(ResidencyEntry),
    MER_F(ResidencyEntry, generation),
    MER_F(ResidencyEntry, tiers),
    MER_F(ResidencyEntry, ram_slot),
    MER_F(ResidencyEntry, vram_slot),
    MER_F(ResidencyEntry, error),
    MER_F(ResidencyEntry, last_use_epoch),
    MER_F(ResidencyEntry, hits),
    MER_F(ResidencyEntry, misses),
    MER_F(ResidencyEntry, loads),
    MER_F(ResidencyEntry, vram_fill),
    sizeof(SlotPin),
    MER_F(SlotPin, word),
    MER_F(SlotPin, last_epoch),
    MER_F(SlotPin, converted_fill),
    // Messages
    sizeof(DemandRequest),
    MER_F(DemandRequest, layer),
    MER_F(DemandRequest, expert),
    MER_F(DemandRequest, request_id),
    MER_F(DemandRequest, epoch),
    MER_F(DemandRequest, pool),
    sizeof(Completion),
    MER_F(Completion, layer),
    MER_F(Completion, expert),
    MER_F(Completion, request_id),
    MER_F(Completion, generation),
    MER_F(Completion, slot),
    MER_F(Completion, status),
    MER_F(Completion, pool),
    sizeof(Hint),
    MER_F(Hint, layer),
    MER_F(Hint, count),
    MER_F(Hint, kind),
    MER_F(Hint, epoch),
    MER_F(Hint, experts),
    MER_F(Hint, confidence),
});

#undef MER_F

bool IsPowerOfTwo(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }

absl::Status CheckCapacity(const char* field, uint32_t capacity) {
  if (capacity < kMinRingCapacity || capacity > kMaxRingCapacity || !IsPowerOfTwo(capacity)) {
    return absl::InvalidArgumentError(absl::StrCat("shm header: ", field, " = ", capacity,
                                                   " is not a power of two in [", kMinRingCapacity, ", ",
                                                   kMaxRingCapacity, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckGeometry(const SegmentGeometry& g, bool slot_bytes_rounded) {
  if (g.n_layer < 1 || g.n_layer > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm header: n_layer = ", g.n_layer, " outside [1, ", kMaxLayers, "]"));
  }
  if (g.n_expert < 1 || g.n_expert > kMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm header: n_expert = ", g.n_expert, " outside [1, ", kMaxExperts, "]"));
  }
  RETURN_IF_ERROR(CheckCapacity("demand_capacity", g.demand_capacity));
  RETURN_IF_ERROR(CheckCapacity("hint_capacity", g.hint_capacity));
  RETURN_IF_ERROR(CheckCapacity("completion_capacity", g.completion_capacity));
  if (g.ram_slot_count > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm header: ram_slot_count = ", g.ram_slot_count, " exceeds ", kMaxSlots));
  }
  if (g.vram_slot_count > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm header: vram_slot_count = ", g.vram_slot_count, " exceeds ", kMaxSlots));
  }
  if (g.ram_slot_bytes > kMaxRamSlotBytes || (g.ram_slot_count > 0 && g.ram_slot_bytes == 0) ||
      (slot_bytes_rounded && g.ram_slot_bytes % kPageBytes != 0)) {
    return absl::InvalidArgumentError(absl::StrCat("shm header: ram_slot_bytes = ", g.ram_slot_bytes, " is not ",
                                                   slot_bytes_rounded ? "a multiple of 4096 " : "", "in [",
                                                   g.ram_slot_count > 0 ? 1 : 0, ", ", kMaxRamSlotBytes, "]"));
  }
  if (uint64_t{g.ram_slot_count} * RoundUp(g.ram_slot_bytes, kPageBytes) > kMaxRamPoolBytes) {
    return absl::InvalidArgumentError(absl::StrCat("shm header: ram_slot_count x ram_slot_bytes = ", g.ram_slot_count,
                                                   " x ", g.ram_slot_bytes, " exceeds ", kMaxRamPoolBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kCompute:
      return "compute";
    case Role::kResidency:
      return "residency";
  }
  return "unknown-role";
}

uint64_t LayoutHash() { return kLayoutHash; }

absl::StatusOr<SegmentHeader> BuildHeader(const SegmentGeometry& geometry) {
  SegmentGeometry g = geometry;
  RETURN_IF_ERROR(CheckGeometry(g, /*slot_bytes_rounded=*/false));
  g.ram_slot_bytes = RoundUp(g.ram_slot_bytes, kPageBytes);

  SegmentHeader h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kMagic;
  h.protocol_version = kProtocolVersion;
  h.header_bytes = sizeof(SegmentHeader);
  h.layout_hash = kLayoutHash;
  h.model_identity = g.model_identity;
  h.n_layer = g.n_layer;
  h.n_expert = g.n_expert;
  h.demand_capacity = g.demand_capacity;
  h.hint_capacity = g.hint_capacity;
  h.completion_capacity = g.completion_capacity;
  h.ram_slot_count = g.ram_slot_count;
  h.ram_slot_bytes = g.ram_slot_bytes;
  h.vram_slot_count = g.vram_slot_count;
  h.max_steps_in_flight = kMaxStepsInFlight;

  uint64_t at = sizeof(SegmentHeader);
  h.control_offset = at;
  at += sizeof(SegmentControl);
  h.demand_ring_offset = at;
  at += RingRegionBytes(g.demand_capacity, sizeof(DemandRequest));
  h.hint_ring_offset = at;
  at += RingRegionBytes(g.hint_capacity, sizeof(Hint));
  h.completion_ring_offset = at;
  at += RingRegionBytes(g.completion_capacity, sizeof(Completion));
  h.table_offset = at;
  at += uint64_t{g.n_layer} * g.n_expert * sizeof(ResidencyEntry);
  h.ram_pins_offset = at;
  at += RoundUp(uint64_t{g.ram_slot_count} * sizeof(SlotPin), kCacheLine);
  h.vram_pins_offset = at;
  at += RoundUp(uint64_t{g.vram_slot_count} * sizeof(SlotPin), kCacheLine);
  at = RoundUp(at, kPageBytes);
  h.ram_pool_offset = at;
  at += uint64_t{g.ram_slot_count} * g.ram_slot_bytes;
  h.segment_bytes = RoundUp(at, kPageBytes);
  return h;
}

absl::StatusOr<SegmentHeader> ValidateHeader(absl::Span<const uint8_t> bytes, uint64_t mapped_bytes,
                                             const ExpectedIdentity* expected) {
  if (mapped_bytes < sizeof(SegmentHeader) || bytes.size() < sizeof(SegmentHeader)) {
    return absl::UnavailableError(absl::StrCat("shm segment: ", mapped_bytes, " bytes mapped, smaller than its ",
                                               sizeof(SegmentHeader), "-byte header (being created?)"));
  }
  SegmentHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic == 0) {
    return absl::UnavailableError("shm header: magic is 0 (segment still being created)");
  }
  if (h.magic != kMagic) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm header: magic = 0x", absl::Hex(h.magic), ", expected 0x", absl::Hex(kMagic)));
  }
  if (h.protocol_version != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm header: protocol_version = ", h.protocol_version, ", this build speaks ", kProtocolVersion));
  }
  if (h.header_bytes != sizeof(SegmentHeader)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shm header: header_bytes = ", h.header_bytes, ", expected ", sizeof(SegmentHeader)));
  }
  if (h.layout_hash != kLayoutHash) {
    return absl::FailedPreconditionError(absl::StrCat("shm header: layout_hash = 0x", absl::Hex(h.layout_hash),
                                                      ", this build's is 0x", absl::Hex(kLayoutHash)));
  }
  if (h.segment_bytes != mapped_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm header: segment_bytes = ", h.segment_bytes, " but the mapping is ", mapped_bytes, " bytes"));
  }
  if (h.max_steps_in_flight != kMaxStepsInFlight) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm header: max_steps_in_flight = ", h.max_steps_in_flight, ", expected ", kMaxStepsInFlight));
  }
  for (uint8_t b : h.reserved) {
    if (b != 0) return absl::InvalidArgumentError("shm header: reserved bytes are not zero");
  }
  SegmentGeometry g;
  g.model_identity = h.model_identity;
  g.n_layer = h.n_layer;
  g.n_expert = h.n_expert;
  g.demand_capacity = h.demand_capacity;
  g.hint_capacity = h.hint_capacity;
  g.completion_capacity = h.completion_capacity;
  g.ram_slot_count = h.ram_slot_count;
  g.ram_slot_bytes = h.ram_slot_bytes;
  g.vram_slot_count = h.vram_slot_count;
  RETURN_IF_ERROR(CheckGeometry(g, /*slot_bytes_rounded=*/true));
  if (expected != nullptr) {
    if (h.model_identity != expected->model_identity) {
      return absl::FailedPreconditionError(absl::StrCat("shm header: model_identity = 0x", absl::Hex(h.model_identity),
                                                        ", expected 0x", absl::Hex(expected->model_identity)));
    }
    if (h.n_layer != expected->n_layer) {
      return absl::FailedPreconditionError(
          absl::StrCat("shm header: n_layer = ", h.n_layer, ", expected ", expected->n_layer));
    }
    if (h.n_expert != expected->n_expert) {
      return absl::FailedPreconditionError(
          absl::StrCat("shm header: n_expert = ", h.n_expert, ", expected ", expected->n_expert));
    }
  }
  // Every offset must be exactly where this layout puts it; BuildHeader cannot fail here since
  // the geometry passed the same checks.
  ASSIGN_OR_RETURN(const SegmentHeader canon, BuildHeader(g));
  struct Field {
    const char* name;
    uint64_t got, want;
  };
  const Field fields[] = {
      {"control_offset", h.control_offset, canon.control_offset},
      {"demand_ring_offset", h.demand_ring_offset, canon.demand_ring_offset},
      {"hint_ring_offset", h.hint_ring_offset, canon.hint_ring_offset},
      {"completion_ring_offset", h.completion_ring_offset, canon.completion_ring_offset},
      {"table_offset", h.table_offset, canon.table_offset},
      {"ram_pins_offset", h.ram_pins_offset, canon.ram_pins_offset},
      {"vram_pins_offset", h.vram_pins_offset, canon.vram_pins_offset},
      {"ram_pool_offset", h.ram_pool_offset, canon.ram_pool_offset},
      {"segment_bytes", h.segment_bytes, canon.segment_bytes},
  };
  for (const Field& f : fields) {
    if (f.got != f.want) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm header: ", f.name, " = ", f.got, ", the layout puts it at ", f.want));
    }
  }
  return h;
}

}  // namespace mer::shm
