// ResidencyExpertSource (services/compute/residency_expert_source.h), compute's side of
// mer-residency, against a real ResidencyDaemon in-process (tests/unit/residency/daemon/).
#include "services/compute/residency_expert_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "tests/unit/residency/daemon/daemon_fixture.h"

namespace mer {
namespace {

using residency::DaemonFixture;
using residency::SynthStoreDir;
using residency::UniqueName;
using ::testing::HasSubstr;

TEST(ResidencyExpertSourceTest, ViewsOverPinnedSlotsAndRelease) {
  DaemonFixture f;
  auto source = ResidencyExpertSource::Connect(f.store(), f.name());
  ASSERT_TRUE(source.ok()) << source.status();
  const int32_t e[] = {1, 2};
  std::vector<ExpertWeights> w(2);
  ASSERT_TRUE((*source)->AcquireLayer(0, e, absl::MakeSpan(w)).ok());
  (*source)->ReleaseLayer(0);
  ASSERT_TRUE((*source)->AcquireLayer(0, e, absl::MakeSpan(w)).ok());
  (*source)->ReleaseLayer(0);
  EXPECT_EQ((*source)->stats().client.hits, 2u);
  EXPECT_EQ((*source)->stats().layers, 2u);
}

// With a pinner (what the cuda backend gives: registration is per process), the RAM tier of the
// attached segment is registered in this process at attach, every view lies inside it, and it is
// unregistered while still mapped when the source goes. A pinner that fails leaves it pageable.
TEST(ResidencyExpertSourceTest, PinsTheRamTierItAttachesAndUnpinsBeforeUnmapping) {
  DaemonFixture f;
  struct Record {
    uint8_t* base = nullptr;
    size_t bytes = 0;
    int registered = 0, unregistered = 0;
    bool mapped_at_unregister = false;
  } r;
  ResidencyExpertSourceOptions o;
  o.pin_ram_tier = [&r](void* base, size_t bytes) -> absl::StatusOr<std::shared_ptr<void>> {
    r.base = static_cast<uint8_t*>(base);
    r.bytes = bytes;
    ++r.registered;
    return std::shared_ptr<void>(base, [&r, bytes](void* p) {
      ++r.unregistered;
      // msync fails with ENOMEM on an address range that is no longer mapped.
      r.mapped_at_unregister = ::msync(p, bytes, MS_ASYNC) == 0;
    });
  };
  {
    auto source = ResidencyExpertSource::Connect(f.store(), f.name(), o);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_TRUE((*source)->ram_tier_pinned());
    EXPECT_THAT((*source)->ram_tier_pinning(), HasSubstr("pinned"));
    EXPECT_EQ(r.registered, 1);
    EXPECT_EQ(r.bytes, size_t{f.daemon().ram_slots()} * f.store().blob_bytes());
    const int32_t e[] = {0, 5};
    std::vector<ExpertWeights> w(2);
    ASSERT_TRUE((*source)->AcquireLayer(1, e, absl::MakeSpan(w)).ok());
    for (const ExpertWeights& v : w) {
      EXPECT_GE(v.gate.data, r.base);
      EXPECT_LE(v.down.data + v.down.rows * v.down.row_bytes(), r.base + r.bytes);
    }
    (*source)->ReleaseLayer(1);
    const StoreLayer& l = f.store().manifest().layers[1];
    const std::optional<ExpertTypes> t = (*source)->expert_types(1);
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->gate, l.gate_type);
    EXPECT_EQ(t->down, l.down_type);
    EXPECT_EQ(r.unregistered, 0);
  }
  EXPECT_EQ(r.unregistered, 1);
  EXPECT_TRUE(r.mapped_at_unregister);

  o.pin_ram_tier = [](void*, size_t) -> absl::StatusOr<std::shared_ptr<void>> {
    return absl::ResourceExhaustedError("no lockable memory");
  };
  auto pageable = ResidencyExpertSource::Connect(f.store(), f.name(), o);
  ASSERT_TRUE(pageable.ok()) << pageable.status();
  EXPECT_FALSE((*pageable)->ram_tier_pinned());
  EXPECT_THAT((*pageable)->ram_tier_pinning(), HasSubstr("no lockable memory"));
}

TEST(ResidencyExpertSourceTest, ConnectFailsWithoutDaemon) {
  ResidencyExpertSourceOptions o;
  o.reconnect_timeout = absl::Milliseconds(50);
  auto store = ExpertStore::Open(SynthStoreDir("micro", SynthQuant::kQ8_0));
  ASSERT_TRUE(store.ok());
  auto source = ResidencyExpertSource::Connect(**store, UniqueName("none"), o);
  EXPECT_FALSE(source.ok());
}

}  // namespace
}  // namespace mer
