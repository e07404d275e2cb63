// The compute side's client of mer-residency: step epochs, expert acquisition (demand, wait for
// completions, pin) and hints; and ResidencyEndpoint, the residency side's counterpart (rings,
// table writes, slot reuse checks).
//
// A compute step:
//   ASSIGN_OR_RETURN(Step step, client.BeginStep());
//   for each layer:
//     std::vector<PinnedExpert> pinned;
//     RETURN_IF_ERROR(client.Acquire(step, layer, experts, deadline, &pinned));
//     ... read pinned[i].bytes ...
//     client.Release(pinned);
//   client.EndStep(step);
// Acquire returns Unavailable when mer-residency died, restarted or superseded the segment: the
// caller drops the client, re-attaches (Reconnect) and retries the step.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/shm/layout.h"
#include "common/shm/residency_table.h"
#include "common/shm/ring.h"
#include "common/shm/segment.h"
#include "common/shm/vram_arena.h"

namespace mer::shm {

struct ClientOptions {
  // mer-residency counts as dead once its heartbeat is this old.
  absl::Duration peer_timeout = absl::Seconds(1);
  // Longest single sleep on the completion ring before re-checking the peer and the table.
  absl::Duration poll_interval = absl::Milliseconds(5);
};

// A step in flight: its epoch, and which of the kMaxStepsInFlight epoch slots it holds.
struct Step {
  uint64_t epoch = 0;
  uint32_t index = kMaxStepsInFlight;
};

// An expert whose slot is pinned for a step: its bytes stay valid until Release.
struct PinnedExpert {
  uint32_t layer = 0;
  uint32_t expert = 0;
  Pool pool = Pool::kRam;
  uint32_t slot = kNoSlot;
  uint64_t generation = 0;
  uint64_t vram_fill = 0;           // VRAM: the upload that filled the slot (ResidencyEntry)
  bool converted = false;           // VRAM: that fill is in the device layout already (kTierVramConverted)
  absl::Span<const uint8_t> bytes;  // the RAM slot (empty for VRAM: the arena is compute's)
};

struct ClientStats {
  uint64_t hits = 0;           // found resident and pinned at once
  uint64_t demands = 0;        // DemandRequests sent
  uint64_t completions = 0;    // Completions consumed
  uint64_t stale = 0;          // completions for no pending request (dropped)
  uint64_t raced = 0;          // pins that failed validation (slot reused meanwhile)
  uint64_t hints_dropped = 0;  // hints not sent because the ring was full
};

class ResidencyClient {
 public:
  // `segment` is attached as Role::kCompute and outlives the client. Records the residency
  // incarnation it talks to; a different one later means Unavailable.
  ResidencyClient(ShmSegment* segment, ClientOptions options = {});

  // Attaches `name` as compute, retrying NotFound/Unavailable (residency starting, or a
  // superseded segment being replaced) until `deadline`.
  static absl::StatusOr<std::unique_ptr<ShmSegment>> Reconnect(const std::string& name,
                                                               const ExpectedIdentity& expected, absl::Time deadline,
                                                               const AttachOptions& options = {});

  ShmSegment& segment() const { return *segment_; }
  uint64_t residency_incarnation() const { return residency_incarnation_; }
  // Counters, updated by Acquire/TryPin/SendHint: read them from the thread that calls those.
  const ClientStats& stats() const { return stats_; }

  // Epochs. BeginStep publishes a new epoch in a free step slot (ResourceExhausted if all
  // kMaxStepsInFlight are taken); EndStep frees it. Thread-safe.
  absl::StatusOr<Step> BeginStep();
  void EndStep(const Step& step);

  // Makes experts[i] of `layer` resident in `pool` and pins each for `step`, writing out[i]
  // (out is resized to experts.size()). Sends a DemandRequest for every expert not resident and
  // waits for the completions until `deadline`, re-checking the table and the peer every
  // poll_interval. Errors (nothing stays pinned then):
  //   Unavailable       mer-residency's heartbeat stopped, it restarted, or the segment was
  //                     superseded: re-attach (Reconnect) and retry
  //   DeadlineExceeded  not all arrived by `deadline`
  //   the Completion's code (e.g. DataLoss for a blob that failed verification), naming the expert
  //   InvalidArgument   layer or an expert out of range
  // One thread at a time (it is the completion ring's single consumer); serialized internally.
  absl::Status Acquire(const Step& step, uint32_t layer, absl::Span<const int32_t> experts, absl::Time deadline,
                       std::vector<PinnedExpert>* out, Pool pool = Pool::kRam);
  void Release(absl::Span<const PinnedExpert> pinned);
  // A VRAM placement `p` (still pinned) is, or is about to be, in the device layout: its fill was
  // converted, or copied from a device-layout RAM copy (SlotPins::NoteConverted).
  void NoteConverted(const PinnedExpert& p) { vram_pins_.NoteConverted(p.slot, p.vram_fill); }

  // Pin protocol, one slot (C1-C3 in residency_table.h): pins the slot the table names for
  // (layer, expert) in `pool` if the table still names it after the pin. False (nothing pinned)
  // when the expert is not resident there. Serialized with Acquire.
  bool TryPin(uint32_t layer, uint32_t expert, Pool pool, uint64_t epoch, PinnedExpert* out);

  // Best effort: false (and counted) when the hint ring is full.
  bool SendHint(const Hint& hint);

  // Publishes the VRAM arena this process exported (info.compute_incarnation is set to this
  // segment's) and waits until mer-residency has imported it, which it does only after clearing
  // every VRAM placement of an earlier arena from the table. Errors: mer-residency's code when it
  // refused the arena (e.g. Unimplemented: built without CUDA), Unavailable when it died or went
  // away, DeadlineExceeded, InvalidArgument for an arena the segment has no pins for.
  absl::Status ExportVramArena(VramArenaInfo info, absl::Time deadline);
  // Withdraws it before its memory is freed and waits (until `deadline`) for mer-residency to
  // have closed it. Unavailable/DeadlineExceeded as above (a dead residency holds nothing).
  absl::Status WithdrawVramArena(absl::Time deadline);

  // OK while the residency this client started with is alive.
  absl::Status CheckPeer() const;

 private:
  bool PinOne(uint32_t layer, uint32_t expert, Pool pool, uint64_t epoch, PinnedExpert* out);
  absl::Status FailAll(absl::Status s, std::vector<PinnedExpert>* out, const std::vector<bool>& done);

  ShmSegment* segment_;
  ClientOptions options_;
  ResidencyTable table_;
  SlotPins ram_pins_, vram_pins_;
  uint64_t residency_incarnation_;

  std::mutex step_mu_;
  uint32_t steps_used_ = 0;  // bitmap of step_epochs slots held by this process

  std::mutex acquire_mu_;  // serializes the ring users below
  RingProducer<DemandRequest> demand_;
  RingConsumer<Completion> completions_;
  std::mutex hint_mu_;
  RingProducer<Hint> hints_;
  uint64_t next_request_ = 0;
  ClientStats stats_;
};

// The residency side: one thread of mer-residency owns the demand and hint consumers, the
// completion producer and the table writes.
class ResidencyEndpoint {
 public:
  explicit ResidencyEndpoint(ShmSegment* segment);

  ShmSegment& segment() const { return *segment_; }
  RingConsumer<DemandRequest>& demand() { return demand_; }
  RingConsumer<Hint>& hints() { return hints_; }
  RingProducer<Completion>& completions() { return completions_; }
  ResidencyTable& table() { return table_; }
  SlotPins& pins(Pool pool) { return pool == Pool::kRam ? ram_pins_ : vram_pins_; }

  // Publishes (layer, expert) resident in RAM slot `ram_slot` (and/or VRAM), then returns the new
  // generation to put in the Completion. The slot's bytes must be complete before this call.
  // `ram_device_layout`: the RAM slot holds the arena's device layout (kTierRamDevice);
  // `vram_converted`: the VRAM fill was copied from such a slot (kTierVramConverted).
  uint64_t PublishResident(uint32_t layer, uint32_t expert, uint32_t ram_slot, uint32_t vram_slot = kNoSlot,
                           uint64_t vram_fill = 0, bool ram_device_layout = false, bool vram_converted = false);
  // Removes (layer, expert) from the RAM tier (R1-R2): the slot becomes reusable once
  // SlotReusable says so.
  uint64_t EvictRam(uint32_t layer, uint32_t expert);
  // Removes (layer, expert) from the VRAM tier (R1-R2), keeping its RAM placement.
  uint64_t EvictVram(uint32_t layer, uint32_t expert);
  VramArenaExport& vram_arena() { return segment_->control().vram_arena; }
  uint64_t PublishFailed(uint32_t layer, uint32_t expert, absl::StatusCode code);

  // Whether no step of the current compute can still read `slot` of `pool` (R3). Call after the
  // entry that named the slot was rewritten. Refreshes the compute liveness once per call.
  bool SlotReusable(Pool pool, uint32_t slot);
  // Smallest epoch of a step in flight (compute_epoch + 1 when none). For eviction order only
  // (an expert last used before every step in flight is a good victim); the safety of a reuse
  // comes from the pins alone (SlotReusable), never from epochs.
  uint64_t MinInflightEpoch() const;

 private:
  ShmSegment* segment_;
  ResidencyTable table_;
  SlotPins ram_pins_, vram_pins_;
  RingConsumer<DemandRequest> demand_;
  RingConsumer<Hint> hints_;
  RingProducer<Completion> completions_;
};

}  // namespace mer::shm
