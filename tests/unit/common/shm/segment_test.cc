// ShmSegment in one process: create, attach, validation against the real mapping, stale segments,
// supersession, liveness.
#include "common/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mer::shm {
namespace {

std::string UniqueName(const char* what) {
  static std::atomic<int> counter{0};
  return absl::StrCat("mer-test-", what, "-", getpid(), "-", counter++);
}

CreateOptions SmallOptions() {
  CreateOptions o;
  o.geometry.model_identity = 0xabc;
  o.geometry.n_layer = 3;
  o.geometry.n_expert = 16;
  o.geometry.demand_capacity = 64;
  o.geometry.hint_capacity = 16;
  o.geometry.completion_capacity = 64;
  o.geometry.ram_slot_count = 4;
  o.geometry.ram_slot_bytes = 4096;
  o.geometry.vram_slot_count = 2;
  return o;
}

ExpectedIdentity Identity() { return ExpectedIdentity{0xabc, 3, 16}; }

TEST(SegmentTest, CreateAttachAndShareMemory) {
  const std::string name = UniqueName("basic");
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ((*res)->role(), Role::kResidency);
  EXPECT_EQ((*res)->incarnation(), 1u);
  auto comp = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(comp.ok()) << comp.status();
  EXPECT_EQ((*comp)->role(), Role::kCompute);
  EXPECT_EQ((*comp)->incarnation(), 1u);
  EXPECT_EQ(std::memcmp(&(*res)->header(), &(*comp)->header(), sizeof(SegmentHeader)), 0);
  EXPECT_NE((*res)->base(), (*comp)->base());  // two mappings of the same object

  // The RAM pool: 4096-aligned slots, shared.
  absl::Span<uint8_t> r = (*res)->ram_slot(3);
  absl::Span<uint8_t> c = (*comp)->ram_slot(3);
  ASSERT_EQ(r.size(), 4096u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data()) % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data()) % 4096, 0u);
  r[100] = 42;
  EXPECT_EQ(c[100], 42);
  EXPECT_TRUE((*res)->ram_slot(4).empty());

  // The table starts not resident, slots kNoSlot.
  std::optional<EntryState> s = (*comp)->table().Read(2, 15);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->ram_slot, kNoSlot);
  EXPECT_EQ(s->vram_slot, kNoSlot);
  (*res)->table().Write(2, 15, kTierRam, 1, kNoSlot);
  EXPECT_EQ((*comp)->table().Read(2, 15)->ram_slot, 1u);

  // Peers see each other.
  PeerInfo p = (*res)->Peer();
  EXPECT_EQ(p.role, Role::kCompute);
  EXPECT_EQ(p.state, ProcessState::kAttached);
  EXPECT_EQ(p.pid, static_cast<uint32_t>(getpid()));
  EXPECT_FALSE(p.gone);
  EXPECT_TRUE((*comp)->CheckPeer(1, absl::Seconds(5)).ok());
  EXPECT_TRUE((*res)->CheckPeer(1, absl::Seconds(5)).ok());

  // Compute detaches cleanly: residency sees it gone.
  comp->reset();
  p = (*res)->Peer();
  EXPECT_EQ(p.state, ProcessState::kDetached);
  EXPECT_TRUE(p.gone);
  EXPECT_TRUE(absl::IsUnavailable((*res)->CheckPeer(1, absl::Seconds(5))));

  // Re-attach: a new incarnation.
  auto again = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->incarnation(), 2u);
  absl::Status st = (*res)->CheckPeer(1, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(st));
  EXPECT_NE(st.message().find("incarnation 1 -> 2"), absl::string_view::npos) << st;

  // The creator unlinks on close.
  again->reset();
  res->reset();
  EXPECT_TRUE(absl::IsNotFound(ShmSegment::Attach(name, Identity()).status()));
}

TEST(SegmentTest, AttachErrors) {
  EXPECT_TRUE(absl::IsNotFound(ShmSegment::Attach(UniqueName("missing"), Identity()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ShmSegment::Attach("bad/name", Identity()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ShmSegment::Attach("", Identity()).status()));

  const std::string name = UniqueName("identity");
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok()) << res.status();
  ExpectedIdentity other = Identity();
  other.model_identity = 0xabd;
  absl::Status st = ShmSegment::Attach(name, other).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("model_identity"), absl::string_view::npos) << st;
  other = Identity();
  other.n_expert = 8;
  st = ShmSegment::Attach(name, other).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("n_expert"), absl::string_view::npos) << st;

  CreateOptions bad = SmallOptions();
  bad.geometry.demand_capacity = 100;
  st = ShmSegment::Create(UniqueName("badgeom"), bad).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("demand_capacity"), absl::string_view::npos) << st;
}

// Writes raw bytes under a name, as a crashed or foreign process could leave them.
void WriteRawObject(const std::string& name, const void* data, size_t size, size_t total) {
  const int fd = shm_open(("/" + name).c_str(), O_CREAT | O_RDWR | O_TRUNC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(total)), 0);
  if (size > 0) {
    ASSERT_EQ(pwrite(fd, data, size, 0), static_cast<ssize_t>(size));
  }
  close(fd);
}

TEST(SegmentTest, AttachValidatesTheRealMapping) {
  const std::string name = UniqueName("raw");
  // Being created: empty object, then a header-sized object whose magic is still 0.
  WriteRawObject(name, nullptr, 0, 0);
  EXPECT_TRUE(absl::IsUnavailable(ShmSegment::Attach(name, Identity()).status()));
  WriteRawObject(name, nullptr, 0, 8192);
  EXPECT_TRUE(absl::IsUnavailable(ShmSegment::Attach(name, Identity()).status()));
  // A valid header for a size other than the object's.
  SegmentHeader h = *BuildHeader(SmallOptions().geometry);
  WriteRawObject(name, &h, sizeof(h), h.segment_bytes + 4096);
  absl::Status st = ShmSegment::Attach(name, Identity()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("segment_bytes"), absl::string_view::npos) << st;
  // Foreign bytes.
  std::string junk(4096, 'x');
  WriteRawObject(name, junk.data(), junk.size(), junk.size());
  st = ShmSegment::Attach(name, Identity()).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("magic"), absl::string_view::npos) << st;
  // Create replaces whatever is there.
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(ShmSegment::Attach(name, Identity()).ok());
}

// Another local user's object under the name: a live-looking segment of the right layout that a
// compute would have used (impersonation), or any object (squatting, which used to stop a
// residency with "File exists"). Needs root to make an object of another user.
TEST(SegmentTest, AnotherUsersSegmentIsNeverMappedNorReclaimed) {
  const std::string name = UniqueName("squat");
  {
    // A perfectly valid segment of the right model, handed to `nobody` and opened to all.
    CreateOptions o = SmallOptions();
    o.unlink_on_close = false;
    auto fake = ShmSegment::Create(name, o);
    ASSERT_TRUE(fake.ok()) << fake.status();
    const int fd = shm_open(("/" + name).c_str(), O_RDWR, 0);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fchmod(fd, 0666), 0);
    if (geteuid() == 0) {
      ASSERT_EQ(fchown(fd, 65534, 65534), 0);
    }
    close(fd);
  }
  absl::Status st = ShmSegment::Attach(name, Identity()).status();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;  // retried: a real residency may still come
  EXPECT_NE(st.message().find(geteuid() == 0 ? "belongs to uid 65534" : "open to other users (mode 0666)"),
            absl::string_view::npos)
      << st;
  if (geteuid() != 0) {
    ASSERT_TRUE(ShmSegment::Remove(name).ok());
    GTEST_SKIP() << "making an object of another user needs root";
  }
  // The residency serves under a fresh name of its own and says which; the squatter's object is
  // left as it was; compute finds the residency's segment by its owner.
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ((*res)->name().rfind(name + ".", 0), 0u) << (*res)->name();
  EXPECT_EQ((*res)->name().size(), name.size() + 17);
  struct stat squat;
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &squat), 0);
  EXPECT_EQ(squat.st_uid, 65534u);
  struct stat own;
  ASSERT_EQ(stat(("/dev/shm/" + (*res)->name()).c_str(), &own), 0);
  EXPECT_EQ(own.st_uid, geteuid());
  EXPECT_EQ(own.st_mode & 0777, 0660u);
  auto comp = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(comp.ok()) << comp.status();
  EXPECT_EQ((*comp)->name(), (*res)->name());
  EXPECT_TRUE((*comp)->CheckPeer(1, absl::Seconds(5)).ok());
  // A restarted residency replaces its own fallback (its predecessor is this process: allowed)
  // and compute follows.
  const std::string first = (*res)->name();
  auto res2 = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res2.ok()) << res2.status();
  EXPECT_TRUE((*comp)->superseded());
  EXPECT_NE(stat(("/dev/shm/" + first).c_str(), &own), 0);  // the old fallback is gone
  comp->reset();
  res->reset();
  res2->reset();
  ASSERT_TRUE(ShmSegment::Remove(name).ok());
}

TEST(SegmentTest, ASegmentOpenToOtherUsersIsRefused) {
  const std::string name = UniqueName("mode");
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok()) << res.status();
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm/" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);  // whatever the umask
  EXPECT_TRUE(ShmSegment::Attach(name, Identity()).ok());
  ASSERT_EQ(chmod(("/dev/shm/" + name).c_str(), 0662), 0);
  absl::Status s = ShmSegment::Attach(name, Identity()).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("open to other users (mode 0662)"), absl::string_view::npos) << s;
}

TEST(SegmentTest, RecreatingSupersedesTheOldSegment) {
  const std::string name = UniqueName("supersede");
  CreateOptions o = SmallOptions();
  auto old_res = ShmSegment::Create(name, o);
  ASSERT_TRUE(old_res.ok());
  auto comp = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(comp.ok());
  EXPECT_TRUE((*comp)->CheckPeer(1, absl::Seconds(5)).ok());
  (*old_res)->table().Write(0, 0, kTierRam, 2, kNoSlot);

  // A new residency takes the name (the old one looks alive, but it is this very process).
  auto new_res = ShmSegment::Create(name, o);
  ASSERT_TRUE(new_res.ok()) << new_res.status();
  EXPECT_TRUE((*comp)->superseded());
  absl::Status st = (*comp)->CheckPeer(1, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnavailable(st));
  EXPECT_NE(st.message().find("superseded"), absl::string_view::npos) << st;

  // Attaching by name reaches the new, fresh segment.
  auto comp2 = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(comp2.ok()) << comp2.status();
  EXPECT_FALSE((*comp2)->superseded());
  EXPECT_EQ((*comp2)->table().Read(0, 0)->ram_slot, kNoSlot);
  EXPECT_TRUE((*comp2)->CheckPeer(1, absl::Seconds(5)).ok());

  // The old creator closing does not unlink the new segment's name.
  old_res->reset();
  EXPECT_TRUE(ShmSegment::Attach(name, Identity()).ok());
}

TEST(SegmentTest, ARoleHeldByAnotherLiveProcessIsRefused) {
  const std::string name = UniqueName("held");
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok());
  auto comp = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(comp.ok());
  // Pretend the compute role belongs to another live process (pid 1 always exists).
  ProcessInfo& info = (*res)->control().process[static_cast<int>(Role::kCompute)];
  info.pid.store(1);
  (*comp)->Beat();
  absl::Status st = ShmSegment::Attach(name, Identity()).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("compute role is held"), absl::string_view::npos) << st;
  AttachOptions take;
  take.take_over_live = true;
  EXPECT_TRUE(ShmSegment::Attach(name, Identity(), take).ok());
  // A stale heartbeat means not alive: attach succeeds.
  info.pid.store(1);
  info.heartbeat_ns.store(1);
  EXPECT_TRUE(ShmSegment::Attach(name, Identity()).ok());

  // The same for a second residency creating over a live one.
  ProcessInfo& rinfo = (*res)->control().process[static_cast<int>(Role::kResidency)];
  rinfo.pid.store(1);
  (*res)->Beat();
  st = ShmSegment::Create(name, SmallOptions()).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("live mer-residency"), absl::string_view::npos) << st;
  rinfo.pid.store(static_cast<uint32_t>(getpid()));
}

TEST(SegmentTest, HeartbeatKeepsThePeerAliveAndItsAbsenceIsNoticed) {
  const std::string name = UniqueName("beat");
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok());
  auto comp = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(comp.ok());
  (*res)->StartHeartbeat(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(60));
  EXPECT_TRUE((*comp)->CheckPeer(1, absl::Milliseconds(40)).ok());
  EXPECT_LT((*comp)->Peer().heartbeat_age, absl::Milliseconds(40));
  (*res)->StopHeartbeat();
  absl::SleepFor(absl::Milliseconds(60));
  absl::Status st = (*comp)->CheckPeer(1, absl::Milliseconds(40));
  EXPECT_TRUE(absl::IsUnavailable(st));
  EXPECT_NE(st.message().find("heartbeat stopped"), absl::string_view::npos) << st;
}

TEST(SegmentTest, ComputeAttachClearsItsPredecessorsStepEpochs) {
  const std::string name = UniqueName("epochs");
  auto res = ShmSegment::Create(name, SmallOptions());
  ASSERT_TRUE(res.ok());
  (*res)->control().step_epochs[3].store(77);
  (*res)->control().compute_epoch.store(80);
  auto comp = ShmSegment::Attach(name, Identity());
  ASSERT_TRUE(comp.ok());
  EXPECT_EQ((*res)->control().step_epochs[3].load(), 0u);
  EXPECT_EQ((*res)->control().compute_epoch.load(), 80u);  // epochs keep increasing across restarts
}

TEST(SegmentTest, RemoveIsIdempotent) {
  const std::string name = UniqueName("remove");
  CreateOptions o = SmallOptions();
  o.unlink_on_close = false;
  { ASSERT_TRUE(ShmSegment::Create(name, o).ok()); }
  EXPECT_TRUE(ShmSegment::Attach(name, Identity()).ok());  // left behind on purpose
  EXPECT_TRUE(ShmSegment::Remove(name).ok());
  EXPECT_TRUE(ShmSegment::Remove(name).ok());
  EXPECT_TRUE(absl::IsNotFound(ShmSegment::Attach(name, Identity()).status()));
}

}  // namespace
}  // namespace mer::shm
