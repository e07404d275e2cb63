// The VRAM arena export (common/shm/vram_arena.h): publication, validation of what is read back,
// and the client's bounded wait for the import.
#include "common/shm/vram_arena.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "common/shm/client.h"
#include "common/shm/segment.h"

namespace mer::shm {
namespace {

VramArenaInfo Info(uint64_t incarnation) {
  VramArenaInfo i;
  i.compute_incarnation = incarnation;
  i.slot_bytes = 5013504;
  i.slot_count = 256;
  i.pci_bus_id = "0000:3b:00.0";
  for (size_t k = 0; k < i.ipc_handle.size(); ++k) i.ipc_handle[k] = static_cast<uint8_t>(255 - k);
  return i;
}

TEST(VramArenaTest, RoundTripsEveryField) {
  VramArenaExport x{};
  EXPECT_FALSE(ReadVramArena(x, 1, 1024).has_value());  // never exported
  auto s = WriteVramArena(x, Info(3), 1024);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s % 2, 0u);
  auto r = ReadVramArena(x, 3, 1024);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->sequence, *s);
  ASSERT_TRUE(r->info.ok()) << r->info.status();
  EXPECT_EQ(r->info->slot_bytes, 5013504u);
  EXPECT_EQ(r->info->slot_count, 256u);
  EXPECT_EQ(r->info->pci_bus_id, "0000:3b:00.0");
  EXPECT_EQ(r->info->ipc_handle, Info(3).ipc_handle);
  // A second export gets a newer sequence.
  auto s2 = WriteVramArena(x, Info(3), 1024);
  ASSERT_TRUE(s2.ok());
  EXPECT_GT(*s2, *s);
}

TEST(VramArenaTest, IgnoresAnotherIncarnationsAndHalfWrittenExports) {
  VramArenaExport x{};
  ASSERT_TRUE(WriteVramArena(x, Info(3), 1024).ok());
  EXPECT_FALSE(ReadVramArena(x, 4, 1024).has_value());  // a dead compute's arena
  x.sequence.fetch_add(1);                              // a writer killed mid-write
  EXPECT_FALSE(ReadVramArena(x, 3, 1024).has_value());
  ASSERT_TRUE(WriteVramArena(x, Info(3), 1024).ok());  // its successor writes over it
  EXPECT_TRUE(ReadVramArena(x, 3, 1024).has_value());
}

TEST(VramArenaTest, RefusesWhatDoesNotFitTheSegment) {
  VramArenaExport x{};
  VramArenaInfo i = Info(1);
  i.slot_count = 2048;
  EXPECT_EQ(WriteVramArena(x, i, 1024).status().code(), absl::StatusCode::kInvalidArgument);
  i = Info(1);
  i.slot_bytes = 1000;  // not a multiple of 256
  EXPECT_EQ(WriteVramArena(x, i, 1024).status().code(), absl::StatusCode::kInvalidArgument);
  i = Info(1);
  i.pci_bus_id = std::string(40, 'x');
  EXPECT_EQ(WriteVramArena(x, i, 1024).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(x.sequence.load(), 0u);  // nothing written
  // A hostile writer's fields are validated when read.
  ASSERT_TRUE(WriteVramArena(x, Info(1), 1024).ok());
  x.slot_count.store(5000);
  auto r = ReadVramArena(x, 1, 1024);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->info.status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteVramArena(x, Info(1), 1024).ok());
  for (auto& w : x.pci_bus_id) w.store(~0ull);  // no NUL
  r = ReadVramArena(x, 1, 1024);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->info.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(VramArenaTest, AckCarriesTheCode) {
  VramArenaExport x{};
  auto s = WriteVramArena(x, Info(1), 1024);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(VramArenaAck(x, *s).has_value());
  AckVramArena(x, *s, absl::StatusCode::kUnimplemented);
  EXPECT_EQ(VramArenaAck(x, *s), absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(VramArenaAck(x, *s + 2).has_value());  // an ack of an older export is not this one's
}

std::string Name(const char* tag) { return "mer-vram-arena-test-" + std::to_string(getpid()) + tag; }

TEST(VramArenaTest, ClientWaitsForTheImportAndGetsItsCode) {
  CreateOptions co;
  co.geometry.n_layer = 2;
  co.geometry.n_expert = 4;
  co.geometry.vram_slot_count = 8;
  auto res = ShmSegment::Create(Name("a"), co);
  ASSERT_TRUE(res.ok()) << res.status();
  (*res)->StartHeartbeat(absl::Milliseconds(10));
  auto comp = ShmSegment::Attach(Name("a"), ExpectedIdentity{0, 2, 4});
  ASSERT_TRUE(comp.ok()) << comp.status();
  ResidencyClient client(comp->get());
  // A residency that answers: it sees compute's incarnation on the export.
  std::thread peer([&] {
    ResidencyEndpoint ep(res->get());
    for (int i = 0; i < 5000; ++i) {
      auto r = ReadVramArena(ep.vram_arena(), (*res)->Peer().incarnation, 8);
      if (r.has_value()) {
        AckVramArena(ep.vram_arena(), r->sequence,
                     r->info.ok() ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal);
        return;
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
  });
  VramArenaInfo i = Info(0);
  i.slot_count = 8;
  const absl::Status s = client.ExportVramArena(i, absl::Now() + absl::Seconds(10));
  peer.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  // Too many slots for the segment's pins: refused before anything is written.
  i.slot_count = 9;
  EXPECT_EQ(client.ExportVramArena(i, absl::Now() + absl::Seconds(1)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(VramArenaTest, ClientGivesUpWhenResidencyIsGone) {
  CreateOptions co;
  co.geometry.n_layer = 1;
  co.geometry.n_expert = 2;
  co.geometry.vram_slot_count = 4;
  auto res = ShmSegment::Create(Name("b"), co);
  ASSERT_TRUE(res.ok()) << res.status();
  auto comp = ShmSegment::Attach(Name("b"), ExpectedIdentity{0, 1, 2});
  ASSERT_TRUE(comp.ok()) << comp.status();
  ClientOptions o;
  o.peer_timeout = absl::Milliseconds(100);
  ResidencyClient client(comp->get(), o);
  VramArenaInfo i = Info(0);
  i.slot_count = 4;
  // Residency never beats again and never answers: Unavailable within the peer timeout, long
  // before the deadline.
  const absl::Time t0 = absl::Now();
  const absl::Status s = client.ExportVramArena(i, absl::Now() + absl::Seconds(30));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

}  // namespace
}  // namespace mer::shm
