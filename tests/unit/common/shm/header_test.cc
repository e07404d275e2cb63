// Header construction and validation: every bad field gives its own error, naming the field.
//
// With MER_SHM_WRITE_SEEDS=<dir> set, also writes the fuzz seeds (tests/fuzz/corpus/shm_header):
//   MER_SHM_WRITE_SEEDS=tests/fuzz/corpus/shm_header build/bin/shm_test --gtest_filter='*Seed*'
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "common/shm/layout.h"
#include "gtest/gtest.h"

namespace mer::shm {
namespace {

SegmentGeometry TinyGeometry() {
  SegmentGeometry g;
  g.model_identity = 0x1234abcdULL;
  g.n_layer = 2;
  g.n_expert = 8;
  g.demand_capacity = 16;
  g.hint_capacity = 8;
  g.completion_capacity = 16;
  g.ram_slot_count = 3;
  g.ram_slot_bytes = 5000;  // rounded to 8192
  g.vram_slot_count = 5;
  return g;
}

absl::Span<const uint8_t> Bytes(const SegmentHeader& h) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(&h), sizeof(h));
}

TEST(HeaderTest, BuildHeaderLaysOutAlignedRegions) {
  const absl::StatusOr<SegmentHeader> h = BuildHeader(TinyGeometry());
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->magic, kMagic);
  EXPECT_EQ(h->protocol_version, kProtocolVersion);
  EXPECT_EQ(h->layout_hash, LayoutHash());
  EXPECT_EQ(h->ram_slot_bytes, 8192u);
  EXPECT_EQ(h->ram_pool_offset % kPageBytes, 0u);
  EXPECT_EQ(h->segment_bytes % kPageBytes, 0u);
  EXPECT_EQ(h->control_offset, sizeof(SegmentHeader));
  for (uint64_t off : {h->control_offset, h->demand_ring_offset, h->hint_ring_offset, h->completion_ring_offset,
                       h->table_offset, h->ram_pins_offset, h->vram_pins_offset}) {
    EXPECT_EQ(off % kCacheLine, 0u) << off;
  }
  EXPECT_LT(h->control_offset, h->demand_ring_offset);
  EXPECT_LT(h->demand_ring_offset, h->hint_ring_offset);
  EXPECT_LT(h->hint_ring_offset, h->completion_ring_offset);
  EXPECT_LT(h->completion_ring_offset, h->table_offset);
  EXPECT_EQ(h->ram_pins_offset - h->table_offset, 2u * 8 * sizeof(ResidencyEntry));
  EXPECT_LE(h->vram_pins_offset + 5 * sizeof(SlotPin), h->ram_pool_offset);
  EXPECT_EQ(h->ram_pool_offset + 3 * 8192, h->segment_bytes);
  const absl::StatusOr<SegmentHeader> v = ValidateHeader(Bytes(*h), h->segment_bytes, nullptr);
  EXPECT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(std::memcmp(&*v, &*h, sizeof(SegmentHeader)), 0);
}

// The layout hash is the value docs/shm_protocol.md documents for this protocol version: a
// change of any size or offset without a version bump (and a new documented value) fails here.
TEST(HeaderTest, LayoutHashIsTheDocumentedOne) {
  static_assert(kProtocolVersion == 3, "a new protocol version documents (and pins here) its own hash");
  EXPECT_EQ(LayoutHash(), 0xd89eb9d232f3ff0eu);
}

TEST(HeaderTest, BuildHeaderRejectsBadGeometry) {
  struct Case {
    const char* field;
    std::function<void(SegmentGeometry&)> mutate;
  };
  const std::vector<Case> cases = {
      {"n_layer", [](SegmentGeometry& g) { g.n_layer = 0; }},
      {"n_layer", [](SegmentGeometry& g) { g.n_layer = kMaxLayers + 1; }},
      {"n_expert", [](SegmentGeometry& g) { g.n_expert = 0; }},
      {"n_expert", [](SegmentGeometry& g) { g.n_expert = kMaxExperts + 1; }},
      {"demand_capacity", [](SegmentGeometry& g) { g.demand_capacity = 12; }},
      {"demand_capacity", [](SegmentGeometry& g) { g.demand_capacity = 1; }},
      {"hint_capacity", [](SegmentGeometry& g) { g.hint_capacity = 0; }},
      {"completion_capacity", [](SegmentGeometry& g) { g.completion_capacity = kMaxRingCapacity * 2; }},
      {"ram_slot_count", [](SegmentGeometry& g) { g.ram_slot_count = kMaxSlots + 1; }},
      {"vram_slot_count", [](SegmentGeometry& g) { g.vram_slot_count = kMaxSlots + 1; }},
      {"ram_slot_bytes", [](SegmentGeometry& g) { g.ram_slot_bytes = 0; }},
      {"ram_slot_bytes", [](SegmentGeometry& g) { g.ram_slot_bytes = kMaxRamSlotBytes + 1; }},
      {"ram_slot_count x ram_slot_bytes",
       [](SegmentGeometry& g) {
         g.ram_slot_count = kMaxSlots;
         g.ram_slot_bytes = kMaxRamSlotBytes;
       }},
  };
  for (const Case& c : cases) {
    SegmentGeometry g = TinyGeometry();
    c.mutate(g);
    const absl::StatusOr<SegmentHeader> h = BuildHeader(g);
    ASSERT_FALSE(h.ok()) << c.field;
    EXPECT_TRUE(absl::IsInvalidArgument(h.status())) << h.status();
    EXPECT_NE(h.status().message().find(c.field), absl::string_view::npos) << h.status();
  }
  SegmentGeometry no_ram = TinyGeometry();
  no_ram.ram_slot_count = 0;
  no_ram.ram_slot_bytes = 0;
  EXPECT_TRUE(BuildHeader(no_ram).ok());
}

TEST(HeaderTest, EachBadFieldIsNamed) {
  const SegmentHeader good = *BuildHeader(TinyGeometry());
  struct Case {
    const char* field;
    absl::StatusCode code;
    std::function<void(SegmentHeader&)> mutate;
  };
  using C = absl::StatusCode;
  const std::vector<Case> cases = {
      {"magic", C::kFailedPrecondition, [](SegmentHeader& h) { h.magic ^= 1; }},
      {"magic is 0", C::kUnavailable, [](SegmentHeader& h) { h.magic = 0; }},
      {"protocol_version", C::kFailedPrecondition, [](SegmentHeader& h) { h.protocol_version = kProtocolVersion + 1; }},
      {"header_bytes", C::kFailedPrecondition, [](SegmentHeader& h) { h.header_bytes = 128; }},
      {"layout_hash", C::kFailedPrecondition, [](SegmentHeader& h) { h.layout_hash ^= 0x10; }},
      {"segment_bytes", C::kInvalidArgument, [](SegmentHeader& h) { h.segment_bytes += 4096; }},
      {"max_steps_in_flight", C::kInvalidArgument, [](SegmentHeader& h) { h.max_steps_in_flight = 8; }},
      {"reserved", C::kInvalidArgument, [](SegmentHeader& h) { h.reserved[17] = 1; }},
      {"n_layer", C::kInvalidArgument, [](SegmentHeader& h) { h.n_layer = 0; }},
      {"n_layer", C::kInvalidArgument, [](SegmentHeader& h) { h.n_layer = 1u << 31; }},
      {"n_expert", C::kInvalidArgument, [](SegmentHeader& h) { h.n_expert = 100000; }},
      {"demand_capacity", C::kInvalidArgument, [](SegmentHeader& h) { h.demand_capacity = 17; }},
      {"hint_capacity", C::kInvalidArgument, [](SegmentHeader& h) { h.hint_capacity = 0; }},
      {"completion_capacity", C::kInvalidArgument, [](SegmentHeader& h) { h.completion_capacity = 3; }},
      {"ram_slot_count", C::kInvalidArgument, [](SegmentHeader& h) { h.ram_slot_count = ~0u; }},
      {"ram_slot_bytes", C::kInvalidArgument, [](SegmentHeader& h) { h.ram_slot_bytes = 5000; }},
      {"ram_slot_bytes", C::kInvalidArgument, [](SegmentHeader& h) { h.ram_slot_bytes = 0; }},
      {"vram_slot_count", C::kInvalidArgument, [](SegmentHeader& h) { h.vram_slot_count = ~0u; }},
      {"control_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.control_offset += 64; }},
      {"demand_ring_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.demand_ring_offset = 0; }},
      {"hint_ring_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.hint_ring_offset += 8; }},
      {"completion_ring_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.completion_ring_offset = ~0ull; }},
      {"table_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.table_offset -= 64; }},
      {"ram_pins_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.ram_pins_offset += 64; }},
      {"vram_pins_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.vram_pins_offset = 1; }},
      {"ram_pool_offset", C::kInvalidArgument, [](SegmentHeader& h) { h.ram_pool_offset += 4096; }},
  };
  for (const Case& c : cases) {
    SegmentHeader h = good;
    c.mutate(h);
    const absl::StatusOr<SegmentHeader> v = ValidateHeader(Bytes(h), good.segment_bytes, nullptr);
    ASSERT_FALSE(v.ok()) << c.field;
    EXPECT_EQ(v.status().code(), c.code) << c.field << ": " << v.status();
    EXPECT_NE(v.status().message().find(c.field), absl::string_view::npos) << c.field << ": " << v.status();
  }
}

TEST(HeaderTest, GeometryThatMovesTheSizeIsCaughtBySize) {
  // A consistent-looking header for another geometry does not match this mapping's size.
  SegmentGeometry g = TinyGeometry();
  g.n_layer = 40;
  const SegmentHeader other = *BuildHeader(g);
  const SegmentHeader good = *BuildHeader(TinyGeometry());
  const absl::StatusOr<SegmentHeader> v = ValidateHeader(Bytes(other), good.segment_bytes, nullptr);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(v.status())) << v.status();
  EXPECT_NE(v.status().message().find("segment_bytes"), absl::string_view::npos) << v.status();
}

TEST(HeaderTest, MappingSmallerThanAHeaderIsUnavailable) {
  const SegmentHeader good = *BuildHeader(TinyGeometry());
  const absl::StatusOr<SegmentHeader> v = ValidateHeader(Bytes(good).subspan(0, 100), good.segment_bytes, nullptr);
  EXPECT_TRUE(absl::IsUnavailable(v.status())) << v.status();
  EXPECT_TRUE(absl::IsUnavailable(ValidateHeader(Bytes(good), 200, nullptr).status()));
  EXPECT_TRUE(absl::IsUnavailable(ValidateHeader({}, 0, nullptr).status()));
}

TEST(HeaderTest, IdentityMismatchIsFailedPrecondition) {
  const SegmentHeader good = *BuildHeader(TinyGeometry());
  ExpectedIdentity id{0x1234abcdULL, 2, 8};
  EXPECT_TRUE(ValidateHeader(Bytes(good), good.segment_bytes, &id).ok());
  struct Case {
    const char* field;
    ExpectedIdentity id;
  };
  for (const Case& c : {Case{"model_identity", {0x1234abceULL, 2, 8}}, Case{"n_layer", {0x1234abcdULL, 3, 8}},
                        Case{"n_expert", {0x1234abcdULL, 2, 16}}}) {
    const absl::StatusOr<SegmentHeader> v = ValidateHeader(Bytes(good), good.segment_bytes, &c.id);
    ASSERT_FALSE(v.ok()) << c.field;
    EXPECT_TRUE(absl::IsFailedPrecondition(v.status())) << v.status();
    EXPECT_NE(v.status().message().find(c.field), absl::string_view::npos) << v.status();
  }
}

// The fuzz target reads [8-byte little-endian mapping size][header bytes]; see shm_header_fuzz.cc.
void WriteSeed(const std::string& dir, const std::string& name, const SegmentHeader& h, uint64_t mapped) {
  std::ofstream out(dir + "/" + name + ".seed", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&mapped), 8);
  out.write(reinterpret_cast<const char*>(&h), sizeof(h));
}

TEST(HeaderTest, WriteSeedCorpus) {
  const char* dir = std::getenv("MER_SHM_WRITE_SEEDS");
  if (dir == nullptr) GTEST_SKIP() << "set MER_SHM_WRITE_SEEDS=<dir> to write the fuzz seeds";
  const SegmentHeader tiny = *BuildHeader(TinyGeometry());
  WriteSeed(dir, "tiny", tiny, tiny.segment_bytes);
  SegmentGeometry g = TinyGeometry();
  g.ram_slot_count = 0;
  g.ram_slot_bytes = 0;
  g.vram_slot_count = 0;
  g.n_layer = 1;
  g.n_expert = 1;
  g.demand_capacity = g.hint_capacity = g.completion_capacity = 2;
  const SegmentHeader minimal = *BuildHeader(g);
  WriteSeed(dir, "minimal", minimal, minimal.segment_bytes);
  SegmentGeometry big;
  big.model_identity = 0xfeedface;
  big.n_layer = 48;
  big.n_expert = 128;
  big.ram_slot_count = 1024;
  big.ram_slot_bytes = 9 << 20;
  big.vram_slot_count = 512;
  const SegmentHeader qwen = *BuildHeader(big);
  WriteSeed(dir, "qwen3_30b", qwen, qwen.segment_bytes);
  SegmentHeader bad = tiny;
  bad.table_offset += 64;
  WriteSeed(dir, "bad_offset", bad, tiny.segment_bytes);
  WriteSeed(dir, "wrong_size", tiny, tiny.segment_bytes - 4096);
}

}  // namespace
}  // namespace mer::shm
