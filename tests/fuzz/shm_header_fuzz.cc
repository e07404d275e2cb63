// libFuzzer target for the shared-memory segment header validation (common/shm/layout.h): what a
// process finds at the start of a segment it attaches is untrusted. Arbitrary bytes must give an
// error or a header whose every region lies inside the mapping, with capacities and slot sizes as
// the layout requires; never a crash, an out-of-bounds read (ASan) or undefined behaviour (UBSan).
//
// Input: [uint64 little-endian: the mapping size][the segment's first bytes (the header)].
// The same bytes are also validated with the input's own length as the mapping size.
//
//   ./build-fuzz/bin/shm_header_fuzz -max_total_time=60 tests/fuzz/corpus/shm_header
//
// The seeds in tests/fuzz/corpus/shm_header are written by shm_test (HeaderTest.WriteSeedCorpus).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "absl/types/span.h"
#include "common/shm/layout.h"
#include "common/shm/residency_table.h"
#include "common/shm/ring.h"

namespace {

using namespace mer::shm;

volatile uint64_t g_sink;

void Require(bool ok) {
  if (!ok) __builtin_trap();
}

bool Inside(uint64_t offset, uint64_t bytes, uint64_t mapped) { return offset <= mapped && bytes <= mapped - offset; }

bool PowerOfTwo(uint32_t x) { return x != 0 && (x & (x - 1)) == 0; }

// What a successful validation promises the attacher.
void CheckPromises(const SegmentHeader& h, uint64_t mapped) {
  Require(h.magic == kMagic && h.layout_hash == LayoutHash() && h.segment_bytes == mapped);
  Require(h.n_layer >= 1 && h.n_layer <= kMaxLayers && h.n_expert >= 1 && h.n_expert <= kMaxExperts);
  Require(PowerOfTwo(h.demand_capacity) && PowerOfTwo(h.hint_capacity) && PowerOfTwo(h.completion_capacity));
  Require(h.ram_slot_bytes % kPageBytes == 0 && h.ram_pool_offset % kPageBytes == 0);
  Require(Inside(h.control_offset, sizeof(SegmentControl), mapped));
  Require(Inside(h.demand_ring_offset, RingRegionBytes(h.demand_capacity, sizeof(DemandRequest)), mapped));
  Require(Inside(h.hint_ring_offset, RingRegionBytes(h.hint_capacity, sizeof(Hint)), mapped));
  Require(Inside(h.completion_ring_offset, RingRegionBytes(h.completion_capacity, sizeof(Completion)), mapped));
  Require(Inside(h.table_offset, uint64_t{h.n_layer} * h.n_expert * sizeof(ResidencyEntry), mapped));
  Require(Inside(h.ram_pins_offset, uint64_t{h.ram_slot_count} * sizeof(SlotPin), mapped));
  Require(Inside(h.vram_pins_offset, uint64_t{h.vram_slot_count} * sizeof(SlotPin), mapped));
  Require(Inside(h.ram_pool_offset, uint64_t{h.ram_slot_count} * h.ram_slot_bytes, mapped));
  for (uint64_t off : {h.control_offset, h.demand_ring_offset, h.hint_ring_offset, h.completion_ring_offset,
                       h.table_offset, h.ram_pins_offset, h.vram_pins_offset}) {
    Require(off % kCacheLine == 0 && off >= sizeof(SegmentHeader));
  }
}

// For small segments, lay the validated header out in real memory and touch the first and last
// item of every region through the views an attacher would build: ASan checks the bounds.
void Exercise(const SegmentHeader& h) {
  if (h.segment_bytes > (8u << 20)) return;
  auto* raw = static_cast<uint8_t*>(::operator new (h.segment_bytes, std::align_val_t{kPageBytes}));
  std::memset(raw, 0, h.segment_bytes);
  std::memcpy(raw, &h, sizeof(h));
  auto ring = [&](uint64_t off, uint32_t cap, auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    RingRegion<T> r{new (raw + off) RingControl(), reinterpret_cast<T*>(raw + off + sizeof(RingControl)), cap};
    RingProducer<T> p(r);
    RingConsumer<T> c(r);
    T item{};
    for (uint32_t i = 0; i <= cap; ++i) p.TryPush(item);  // fills every slot, then refuses
    T out;
    while (c.TryPop(&out)) g_sink = g_sink + 1;
  };
  ring(h.demand_ring_offset, h.demand_capacity, static_cast<DemandRequest*>(nullptr));
  ring(h.hint_ring_offset, h.hint_capacity, static_cast<Hint*>(nullptr));
  ring(h.completion_ring_offset, h.completion_capacity, static_cast<Completion*>(nullptr));
  ResidencyTable table(reinterpret_cast<ResidencyEntry*>(raw + h.table_offset), h.n_layer, h.n_expert);
  table.Write(0, 0, kTierRam, 0, kNoSlot);
  table.Write(h.n_layer - 1, h.n_expert - 1, kTierRam, 0, kNoSlot);
  g_sink = g_sink + table.Read(h.n_layer - 1, h.n_expert - 1)->generation;
  for (auto [off, count] : {std::pair<uint64_t, uint32_t>{h.ram_pins_offset, h.ram_slot_count},
                            std::pair<uint64_t, uint32_t>{h.vram_pins_offset, h.vram_slot_count}}) {
    SlotPins pins(reinterpret_cast<SlotPin*>(raw + off), count);
    if (count > 0) {
      pins.Pin(count - 1, 1, 1);
      pins.Unpin(count - 1, 1);
    }
  }
  if (h.ram_slot_count > 0) {
    raw[h.ram_pool_offset] = 1;
    raw[h.ram_pool_offset + uint64_t{h.ram_slot_count} * h.ram_slot_bytes - 1] = 1;
  }
  ::operator delete (raw, std::align_val_t{kPageBytes});
}

void Validate(absl::Span<const uint8_t> bytes, uint64_t mapped) {
  const ExpectedIdentity id{0x1234abcdULL, 2, 8};
  for (const ExpectedIdentity* expected : {static_cast<const ExpectedIdentity*>(nullptr), &id}) {
    absl::StatusOr<SegmentHeader> h = ValidateHeader(bytes, mapped, expected);
    if (!h.ok()) {
      Require(!h.status().message().empty());
      continue;
    }
    CheckPromises(*h, mapped);
    if (expected != nullptr) {
      Require(h->model_identity == id.model_identity && h->n_layer == id.n_layer && h->n_expert == id.n_expert);
    } else {
      Exercise(*h);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 8) {
    uint64_t mapped;
    std::memcpy(&mapped, data, 8);
    Validate(absl::MakeConstSpan(data + 8, size - 8), mapped);
  }
  Validate(absl::MakeConstSpan(data, size), size);
  return 0;
}
