// The shared-memory segment of one mer instance: creation (mer-residency), attachment
// (mer-compute, or a restarted mer-residency), region accessors and peer liveness.
//
// Lifetime and restarts
// ---------------------
// - mer-residency owns the name. Create() always makes a fresh segment: if one of the same name
//   exists (a previous residency crashed, or exited without cleaning up), and it is of this
//   layout, Create marks it superseded and wakes every sleeper in it, then unlinks the name and
//   creates the new one. A compute still mapping the old segment sees `superseded` (or the old
//   residency's stale heartbeat) and re-attaches by name. Create refuses (FailedPrecondition)
//   while the old segment's residency is alive (attached, heartbeat fresh, process present),
//   unless take_over_live is set.
// - mer-compute Attach()es by name and validates the header as untrusted input (layout.h
//   ValidateHeader) on a private copy, then uses only that copy's offsets. Attaching bumps the
//   role's incarnation, so the peer can tell "the same process" from "a restarted one" even when
//   heartbeats never went stale; a restarted compute also voids every pin of its predecessor
//   (pins are tagged with the incarnation) and clears the step epochs it owns.
// - No interprocess mutex exists anywhere: a process may die at any instruction. Liveness is
//   judged from the peer's ProcessInfo: state, heartbeat age, and (when both share a pid
//   namespace) whether its pid still exists.
//
// Ownership (/dev/shm is writable by every local user)
// ----------------------------------------------------
// - Create makes the object with O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600 and then exactly
//   `permissions` & 0770 (never anything for other users, whatever the umask). Only an object of
//   this user is ever reclaimed (superseded and unlinked). An object of the name that belongs to
//   another user (a squatter, or another user's instance) is left alone and this residency serves
//   under "NAME.<16 hex digits>" instead, a fresh name made with O_EXCL, and says so.
// - Attach maps only an object owned by this user or root, a regular file, with no permission
//   for other users (fstat of the descriptor it maps, so no race): anything else is refused,
//   naming the owner or mode. When NAME itself is absent or refused, the live segment of a
//   residency of this user under "NAME.<hex>" is attached instead.
//
// Thread safety: the accessors are const and thread-safe; Beat() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/shm/layout.h"
#include "common/shm/residency_table.h"
#include "common/shm/ring.h"

namespace mer::shm {

struct CreateOptions {
  SegmentGeometry geometry;
  // Remove the name when this segment is closed (if the name still refers to this segment).
  bool unlink_on_close = true;
  // Allocate the whole segment up front (posix_fallocate), so a full /dev/shm is an error here
  // rather than a SIGBUS later.
  bool reserve_memory = true;
  // Replace an existing segment even while its residency looks alive.
  bool take_over_live = false;
  // A holder whose heartbeat is older than this counts as not alive.
  absl::Duration liveness_timeout = absl::Seconds(2);
  // Mode of the object; bits for other users are always dropped.
  uint32_t permissions = 0660;
};

struct AttachOptions {
  Role role = Role::kCompute;
  bool take_over_live = false;
  absl::Duration liveness_timeout = absl::Seconds(2);
};

// What one process can tell about the other role.
struct PeerInfo {
  Role role = Role::kCompute;
  ProcessState state = ProcessState::kNever;
  uint64_t incarnation = 0;
  uint32_t pid = 0;
  absl::Duration heartbeat_age = absl::InfiniteDuration();  // since its last beat
  // The process is known to be gone: it detached, or its pid (same pid namespace) no longer
  // exists. A killed-but-unreaped child (zombie) is not "gone" by pid; its heartbeat stops.
  bool gone = false;
  bool AliveWithin(absl::Duration timeout) const {
    return state == ProcessState::kAttached && !gone && heartbeat_age <= timeout;
  }
};

class ShmSegment {
 public:
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Create(const std::string& name, const CreateOptions& options);
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Attach(const std::string& name, const ExpectedIdentity& expected,
                                                            const AttachOptions& options = {});
  // OK when a segment of `expected` for instance `name` (or a fallback of it) is trusted (see
  // Ownership) and its residency is alive (CheckPeer's conditions, heartbeat within
  // `liveness_timeout`); otherwise the reason (NotFound, Unavailable, ...). Registers nothing.
  static absl::Status Probe(const std::string& name, const ExpectedIdentity& expected, absl::Duration liveness_timeout);
  // Unlinks `name` if it exists (for tests and `mer` tooling). OK when absent.
  static absl::Status Remove(const std::string& name);

  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  // Marks this role detached (a clean exit), stops the heartbeat, unmaps; the creator with
  // unlink_on_close also unlinks the name if it still refers to this segment.
  ~ShmSegment();

  // The object's name: the instance's, or the fallback it was created or found under.
  const std::string& name() const { return name_; }
  Role role() const { return role_; }
  uint64_t incarnation() const { return incarnation_; }
  const SegmentHeader& header() const { return header_; }  // the validated copy
  uint8_t* base() const { return base_; }
  uint64_t size() const { return header_.segment_bytes; }

  SegmentControl& control() const;
  RingRegion<DemandRequest> demand_ring() const;
  RingRegion<Hint> hint_ring() const;
  RingRegion<Completion> completion_ring() const;
  ResidencyTable table() const;
  SlotPins pins(Pool pool) const;
  // The bytes of RAM slot k (ram_slot_bytes long, 4096-aligned). Empty if k is out of range.
  absl::Span<uint8_t> ram_slot(uint32_t k) const;

  // Liveness of this process, as the peer sees it.
  void Beat();
  // Beats every `interval` from a background thread until StopHeartbeat or destruction.
  void StartHeartbeat(absl::Duration interval);
  void StopHeartbeat();

  // The other role.
  PeerInfo Peer() const;
  // OK while the peer is the incarnation `expected_incarnation`, attached, beating within
  // `timeout` and present, and this segment has not been superseded. Otherwise Unavailable,
  // saying which: the caller then re-attaches (compute) or drops per-peer state (residency).
  absl::Status CheckPeer(uint64_t expected_incarnation, absl::Duration timeout) const;
  bool superseded() const;

 private:
  struct Impl;
  ShmSegment(std::string name, Role role);
  // An object of this user under `name` left by an earlier residency: superseded and unlinked
  // (true), or FailedPrecondition while its residency lives. false: not this user's, untouched.
  static absl::StatusOr<bool> ReclaimStale(const std::string& name, const CreateOptions& options);
  // kAttach: as Attach; kAttachLive: Unavailable unless its residency is alive; kProbe: only
  // that check, nothing registered (the result is unmapped, for its status only).
  enum class Mode { kAttach, kAttachLive, kProbe };
  // The object `name` for instance `instance` (a fallback name, or the same).
  static absl::StatusOr<std::unique_ptr<ShmSegment>> AttachOne(const std::string& instance, const std::string& name,
                                                               const ExpectedIdentity& expected,
                                                               const AttachOptions& options, Mode mode);
  void Register(Role role);

  std::string name_;
  Role role_;
  uint64_t incarnation_ = 0;
  bool creator_ = false;
  bool unlink_on_close_ = false;
  SegmentHeader header_{};
  uint8_t* base_ = nullptr;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mer::shm
