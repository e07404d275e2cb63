// The wire layout of the shared-memory segment between mer-compute and mer-residency.
//
// Everything here is a plain standard-layout struct of fixed-size fields and lock-free,
// address-free std::atomic<uint32_t/uint64_t>; regions are located by byte offsets from the start
// of the segment (never pointers), so the two processes may map it at different addresses. The
// byte-level specification, with every offset, is docs/shm_protocol.md; the layout hash below
// changes whenever a size or an offset of any of these structs changes, and Attach refuses a
// segment whose hash differs from its own.
//
// Segment = [SegmentHeader][SegmentControl][demand ring][hint ring][completion ring]
//           [residency table][RAM slot pins][VRAM slot pins][padding to 4096][RAM slot pool]
//
// The header is written once by the creator (mer-residency) before it publishes `magic` with a
// release store; after that it is immutable, and a reader validates a private copy of it
// (ValidateHeader) like any untrusted input before using a single offset.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mer::shm {

// "merSHM01" read as a little-endian uint64.
inline constexpr uint64_t kMagic = 0x31304D485372656DULL;
inline constexpr uint32_t kProtocolVersion = 3;

inline constexpr uint32_t kCacheLine = 64;
inline constexpr uint32_t kPageBytes = 4096;  // RAM slot size and pool alignment (O_DIRECT)
inline constexpr uint32_t kMaxStepsInFlight = 16;
inline constexpr uint32_t kHintMaxExperts = 16;
inline constexpr uint32_t kNoSlot = 0xFFFFFFFFu;

// Bounds a header must respect (ValidateHeader); they also keep every size computation far from
// uint64 overflow.
inline constexpr uint32_t kMaxLayers = 1024;
inline constexpr uint32_t kMaxExperts = 4096;  // hints carry expert ids as uint16
inline constexpr uint32_t kMinRingCapacity = 2;
inline constexpr uint32_t kMaxRingCapacity = 1u << 20;
inline constexpr uint32_t kMaxSlots = 1u << 20;  // RAM slots, and VRAM slots
inline constexpr uint64_t kMaxRamSlotBytes = 4ull << 30;
inline constexpr uint64_t kMaxRamPoolBytes = 16ull << 40;
inline constexpr uint64_t kMaxVramSlotBytes = 4ull << 30;  // an exported arena's slot size
inline constexpr uint32_t kVramSlotAlign = 256;            // and its alignment
inline constexpr uint32_t kIpcHandleBytes = 64;            // sizeof(cudaIpcMemHandle_t)
inline constexpr uint32_t kPciBusIdBytes = 32;             // cudaDeviceGetPCIBusId's string, NUL-padded

static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<uint32_t>) == 4 && sizeof(std::atomic<uint64_t>) == 8);
static_assert(std::is_standard_layout_v<std::atomic<uint64_t>>);

enum class Role : uint32_t { kCompute = 0, kResidency = 1 };
inline constexpr int kRoleCount = 2;
const char* RoleName(Role role);

// Which slot pool a slot number refers to.
enum class Pool : uint8_t { kRam = 0, kVram = 1 };

// ---------------------------------------------------------------------------------------------
// Header: immutable after publication. Plain fields only (it is validated as a byte copy).
struct alignas(kCacheLine) SegmentHeader {
  uint64_t magic;             // kMagic, stored last (release) by the creator
  uint32_t protocol_version;  // kProtocolVersion
  uint32_t header_bytes;      // sizeof(SegmentHeader)
  uint64_t segment_bytes;     // total size; must equal the size of the mapping
  uint64_t layout_hash;       // LayoutHash() of the creator's build
  uint64_t model_identity;    // caller-supplied hash of the model (file, quantization...)
  uint32_t n_layer;           // geometry: the residency table is n_layer x n_expert
  uint32_t n_expert;
  uint32_t demand_capacity;  // ring capacities: powers of two
  uint32_t hint_capacity;
  uint32_t completion_capacity;
  uint32_t ram_slot_count;          // RAM tier: slots in the pool at ram_pool_offset
  uint64_t ram_slot_bytes;          // multiple of kPageBytes
  uint32_t vram_slot_count;         // VRAM arena slots (the arena itself lives in compute)
  uint32_t max_steps_in_flight;     // == kMaxStepsInFlight
  uint64_t created_unix_ns;         // informational
  uint64_t control_offset;          // SegmentControl
  uint64_t demand_ring_offset;      // RingControl, then demand_capacity DemandRequest
  uint64_t hint_ring_offset;        // RingControl, then hint_capacity Hint
  uint64_t completion_ring_offset;  // RingControl, then completion_capacity Completion
  uint64_t table_offset;            // n_layer * n_expert ResidencyEntry, layer-major
  uint64_t ram_pins_offset;         // ram_slot_count SlotPin
  uint64_t vram_pins_offset;        // vram_slot_count SlotPin
  uint64_t ram_pool_offset;         // ram_slot_count * ram_slot_bytes, 4096-aligned
  uint8_t reserved[104];            // zero
};
static_assert(sizeof(SegmentHeader) == 256);
static_assert(std::is_trivially_copyable_v<SegmentHeader>);

// ---------------------------------------------------------------------------------------------
// Control block: the mutable, process-level state.

enum class ProcessState : uint32_t { kNever = 0, kAttached = 1, kDetached = 2 };

// One per role, on its own cache line. Written only by the process holding the role.
struct alignas(kCacheLine) ProcessInfo {
  std::atomic<uint64_t> incarnation;   // bumped at every attach (creation counts); 0 = never
  std::atomic<uint64_t> heartbeat_ns;  // CLOCK_MONOTONIC ns of the last beat
  std::atomic<uint64_t> attach_ns;     // CLOCK_MONOTONIC ns of the attach
  std::atomic<uint64_t> pid_ns;        // inode of /proc/self/ns/pid: whether `pid` means anything here
  std::atomic<uint32_t> pid;
  std::atomic<uint32_t> state;  // ProcessState
  uint8_t reserved[24];
};
static_assert(sizeof(ProcessInfo) == 64);

// The VRAM arena compute exported through CUDA IPC (docs/cuda.md, "The arena over CUDA IPC").
// The export (sequence .. ipc_handle) is written by compute only, under the seqlock `sequence`
// (odd while compute writes; the protocol of residency_table.h); the import result by residency
// only. compute: write the export, then wait until imported_sequence == its sequence and read
// import_status. Residency acts on an export only if compute_incarnation is the live compute's
// (an export left by a dead compute names memory that is gone), and clears every VRAM placement
// of the table before it acknowledges an import, so that compute never reads a placement in
// another arena than the one it exported.
struct alignas(kCacheLine) VramArenaExport {
  std::atomic<uint64_t> sequence;             // seqlock; 0 = never exported
  std::atomic<uint64_t> compute_incarnation;  // the exporting compute's ProcessInfo incarnation
  std::atomic<uint64_t> slot_bytes;           // multiple of kVramSlotAlign, <= kMaxVramSlotBytes
  std::atomic<uint32_t> slot_count;           // 1 .. header.vram_slot_count
  std::atomic<uint32_t> reserved0;
  std::atomic<uint64_t> pci_bus_id[kPciBusIdBytes / 8];   // the device, NUL-padded ASCII
  std::atomic<uint64_t> ipc_handle[kIpcHandleBytes / 8];  // cudaIpcMemHandle_t of the arena base
  // Written by residency.
  alignas(kCacheLine) std::atomic<uint64_t> imported_sequence;  // the export it acted on last
  std::atomic<uint32_t> import_status;                          // absl::StatusCode of that import; 0 = OK, imported
  std::atomic<uint32_t> reserved1;
};
static_assert(sizeof(VramArenaExport) == 192);

struct alignas(kCacheLine) SegmentControl {
  ProcessInfo process[kRoleCount];  // indexed by Role
  // Set to 1 by a newer mer-residency that replaced this segment by one of the same name; the
  // peer then re-attaches by name. Written once; the futex words of every ring are bumped after.
  alignas(kCacheLine) std::atomic<uint32_t> superseded;
  uint32_t reserved0;
  // Epochs (written by compute only). compute_epoch is the epoch of the newest step begun; each
  // step in flight holds one of step_epochs (its epoch; 0 = free) from BeginStep to EndStep.
  alignas(kCacheLine) std::atomic<uint64_t> compute_epoch;
  alignas(kCacheLine) std::atomic<uint64_t> step_epochs[kMaxStepsInFlight];
  VramArenaExport vram_arena;
};
static_assert(sizeof(SegmentControl) == 64 * 4 + 8 * kMaxStepsInFlight + sizeof(VramArenaExport));

// ---------------------------------------------------------------------------------------------
// Ring control (see ring.h for the protocol). head and tail count items ever pushed / popped; they
// never wrap in practice (2^64) and the slot of position p is p & (capacity - 1).
struct alignas(kCacheLine) RingControl {
  alignas(kCacheLine) std::atomic<uint64_t> head;         // written by the producer only
  alignas(kCacheLine) std::atomic<uint64_t> tail;         // written by the consumer only
  alignas(kCacheLine) std::atomic<uint32_t> data_futex;   // bumped by the producer
  std::atomic<uint32_t> consumer_waiting;                 // 1 while the consumer may sleep
  alignas(kCacheLine) std::atomic<uint32_t> space_futex;  // bumped by the consumer
  std::atomic<uint32_t> producer_waiting;                 // 1 while the producer may sleep
};
static_assert(sizeof(RingControl) == 256);

// ---------------------------------------------------------------------------------------------
// Residency table entry, one cache line per (layer, expert). See residency_table.h for the
// seqlock protocol. `generation` .. `error` are written by residency only, under the seqlock;
// last_use_epoch, hits and misses are written by compute (plain atomics, no seqlock); loads by
// residency.
enum TierBits : uint32_t {
  kTierNvme = 1u << 0,     // present in the expert store
  kTierRam = 1u << 1,      // bytes valid in RAM slot `ram_slot`
  kTierVram = 1u << 2,     // bytes valid in VRAM slot `vram_slot`
  kTierLoading = 1u << 3,  // a load is in progress
  kTierFailed = 1u << 4,   // the last load failed with absl::StatusCode `error`
  // RAM slot `ram_slot` holds the expert in the VRAM arena's device layout (demoted from VRAM
  // with exclusive tiers), not its blob: only a copy back into the arena reads it. kTierRam is
  // clear then, so compute never takes it for a blob.
  kTierRamDevice = 1u << 5,
  // The fill in `vram_slot` was copied from such a RAM slot: it is in the device layout already
  // and compute does not convert it.
  kTierVramConverted = 1u << 6,
};

struct alignas(kCacheLine) ResidencyEntry {
  std::atomic<uint64_t> generation;      // seqlock sequence: odd while residency writes
  std::atomic<uint32_t> tiers;           // TierBits
  std::atomic<uint32_t> ram_slot;        // kNoSlot unless kTierRam
  std::atomic<uint32_t> vram_slot;       // kNoSlot unless kTierVram
  std::atomic<uint32_t> error;           // absl::StatusCode of the last failed load
  std::atomic<uint64_t> last_use_epoch;  // compute: newest step epoch that pinned it
  std::atomic<uint64_t> hits;            // compute: acquisitions found resident
  std::atomic<uint64_t> misses;          // compute: acquisitions that had to demand it
  std::atomic<uint64_t> loads;           // residency: completed loads into RAM
  // Residency's number for the upload that put the bytes in vram_slot (0 unless kTierVram),
  // unique within a segment: compute converts a slot to its device layout once per fill.
  std::atomic<uint64_t> vram_fill;
};
static_assert(sizeof(ResidencyEntry) == 64);

// Pin of one RAM or VRAM slot. word = (compute incarnation & 0xffffffff) << 32 | pin count. A pin
// taken by an earlier compute incarnation (a process that died) is void: its tag is not the
// current incarnation's. last_epoch = newest step epoch that pinned the slot. converted_fill (VRAM
// slots): the fill (ResidencyEntry::vram_fill) compute converted to its device layout in the slot,
// written by compute while it pins the slot, so that once unpinned the conversion is complete;
// with exclusive tiers residency copies an evicted expert back into RAM as device layout only
// when this names its fill.
struct SlotPin {
  std::atomic<uint64_t> word;
  std::atomic<uint64_t> last_epoch;
  std::atomic<uint64_t> converted_fill;
  uint64_t reserved;
};
static_assert(sizeof(SlotPin) == 32);

// ---------------------------------------------------------------------------------------------
// Messages (trivially copyable, fixed size).

// compute -> residency: "layer `layer` expert `expert` is needed now in `pool`".
struct DemandRequest {
  uint32_t layer;
  uint32_t expert;
  uint64_t request_id;  // (compute incarnation << 32) | counter; echoed in the Completion
  uint64_t epoch;       // step epoch that needs it
  uint8_t pool;         // Pool
  uint8_t reserved[7];
};
static_assert(sizeof(DemandRequest) == 32);

// residency -> compute: "(layer, expert) is in `pool` slot `slot`, table generation `generation`",
// or it could not be loaded (`status` != 0: an absl::StatusCode, e.g. DataLoss for a blob that
// failed verification). Published after the table entry, so the table already shows it.
struct Completion {
  uint32_t layer;
  uint32_t expert;
  uint64_t request_id;
  uint64_t generation;
  uint32_t slot;
  uint16_t status;  // absl::StatusCode; 0 = OK
  uint8_t pool;     // Pool
  uint8_t reserved;
};
static_assert(sizeof(Completion) == 32);

enum class HintKind : uint8_t { kRouted = 0, kPredicted = 1 };

// compute -> residency: the experts a step routed to (kRouted), or those predicted for a coming
// layer (kPredicted), each with a confidence in [0, 255] (255 = certain). Best effort: dropped
// when the ring is full.
struct Hint {
  uint32_t layer;
  uint16_t count;  // <= kHintMaxExperts
  uint8_t kind;    // HintKind
  uint8_t reserved;
  uint64_t epoch;
  uint16_t experts[kHintMaxExperts];
  uint8_t confidence[kHintMaxExperts];
};
static_assert(sizeof(Hint) == 64);

static_assert(std::is_trivially_copyable_v<DemandRequest> && std::is_trivially_copyable_v<Completion> &&
              std::is_trivially_copyable_v<Hint>);
static_assert(std::is_standard_layout_v<SegmentControl> && std::is_standard_layout_v<RingControl> &&
              std::is_standard_layout_v<ResidencyEntry> && std::is_standard_layout_v<SlotPin>);

// ---------------------------------------------------------------------------------------------

// Hash of every size and offset above plus the protocol constants (FNV-1a 64).
uint64_t LayoutHash();

// What the creator chooses.
struct SegmentGeometry {
  uint64_t model_identity = 0;
  uint32_t n_layer = 0;
  uint32_t n_expert = 0;
  uint32_t demand_capacity = 1024;
  uint32_t hint_capacity = 256;
  uint32_t completion_capacity = 1024;
  uint32_t ram_slot_count = 0;
  uint64_t ram_slot_bytes = 0;  // rounded up to kPageBytes by BuildHeader
  uint32_t vram_slot_count = 0;
};

// What an attacher expects of the segment: the same model, cut the same way.
struct ExpectedIdentity {
  uint64_t model_identity = 0;
  uint32_t n_layer = 0;
  uint32_t n_expert = 0;
};

inline uint64_t RoundUp(uint64_t x, uint64_t align) { return (x + align - 1) / align * align; }
inline uint64_t RingRegionBytes(uint32_t capacity, size_t item_bytes) {
  return sizeof(RingControl) + RoundUp(uint64_t{capacity} * item_bytes, kCacheLine);
}

// The header of a segment of this geometry, offsets and size filled in (magic included; the
// creator copies it in and then publishes the magic). InvalidArgument naming the field when the
// geometry is out of bounds.
absl::StatusOr<SegmentHeader> BuildHeader(const SegmentGeometry& geometry);

// Validates the first bytes of a segment as untrusted input: `bytes` is what lies at the start of
// the mapping (at least the header, if the mapping is that large), `mapped_bytes` the size of the
// mapping. Errors name the field:
//   Unavailable         the mapping is smaller than a header or magic is still 0 (being created)
//   FailedPrecondition  magic, protocol_version, header_bytes, layout_hash, model identity or
//                       geometry different from `expected`: an incompatible peer or model
//   InvalidArgument     segment_bytes vs the mapping, geometry out of bounds, an offset that is not
//                       where this layout puts it, nonzero reserved bytes: a malformed header
// On success returns the validated copy, whose offsets all lie inside `mapped_bytes`.
absl::StatusOr<SegmentHeader> ValidateHeader(absl::Span<const uint8_t> bytes, uint64_t mapped_bytes,
                                             const ExpectedIdentity* expected);

}  // namespace mer::shm
