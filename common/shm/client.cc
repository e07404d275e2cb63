#include "common/shm/client.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/check.h"
#include "common/base/cpu_relax.h"
#include "common/base/status.h"

namespace mer::shm {
namespace {

absl::StatusCode ToCode(uint16_t status) {
  if (status > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) return absl::StatusCode::kUnknown;
  return static_cast<absl::StatusCode>(status);
}

// Polls `ready` for a short while before the caller sleeps: a completion for an expert already in
// RAM comes back within microseconds, much less than a futex round trip.
template <typename Ready>
bool Spin(Ready ready, int iterations) {
  for (int i = 0; i < iterations; ++i) {
    if (ready()) return true;
    CpuRelax();
  }
  return false;
}

}  // namespace

ResidencyClient::ResidencyClient(ShmSegment* segment, ClientOptions options)
    : segment_(segment),
      options_(options),
      table_(segment->table()),
      ram_pins_(segment->pins(Pool::kRam)),
      vram_pins_(segment->pins(Pool::kVram)),
      residency_incarnation_(segment->Peer().incarnation),
      demand_(segment->demand_ring()),
      completions_(segment->completion_ring()),
      hints_(segment->hint_ring()) {
  CHECK(segment->role() == Role::kCompute);
  // Completions addressed to a previous compute incarnation are of no use to this one.
  Completion drain[64];
  while (completions_.PopBatch(absl::MakeSpan(drain)) > 0) {
  }
}

absl::StatusOr<std::unique_ptr<ShmSegment>> ResidencyClient::Reconnect(const std::string& name,
                                                                       const ExpectedIdentity& expected,
                                                                       absl::Time deadline,
                                                                       const AttachOptions& options) {
  absl::Duration backoff = absl::Milliseconds(1);
  for (;;) {
    absl::StatusOr<std::unique_ptr<ShmSegment>> seg = ShmSegment::Attach(name, expected, options);
    if (seg.ok()) return seg;
    if (!absl::IsNotFound(seg.status()) && !absl::IsUnavailable(seg.status())) return seg;
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("shm: could not re-attach '", name, "' in time: ", seg.status().message()));
    }
    absl::SleepFor(std::min(backoff, deadline - now));
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

absl::Status ResidencyClient::CheckPeer() const {
  return segment_->CheckPeer(residency_incarnation_, options_.peer_timeout);
}

absl::StatusOr<Step> ResidencyClient::BeginStep() {
  std::lock_guard<std::mutex> lock(step_mu_);
  for (uint32_t i = 0; i < kMaxStepsInFlight; ++i) {
    if ((steps_used_ & (1u << i)) != 0) continue;
    steps_used_ |= 1u << i;
    SegmentControl& c = segment_->control();
    Step step;
    step.index = i;
    step.epoch = c.compute_epoch.fetch_add(1, std::memory_order_seq_cst) + 1;
    c.step_epochs[i].store(step.epoch, std::memory_order_seq_cst);
    return step;
  }
  return absl::ResourceExhaustedError(absl::StrCat("shm: all ", kMaxStepsInFlight, " step epoch slots are in flight"));
}

void ResidencyClient::EndStep(const Step& step) {
  if (step.index >= kMaxStepsInFlight) return;
  std::lock_guard<std::mutex> lock(step_mu_);
  segment_->control().step_epochs[step.index].store(0, std::memory_order_release);
  steps_used_ &= ~(1u << step.index);
}

bool ResidencyClient::TryPin(uint32_t layer, uint32_t expert, Pool pool, uint64_t epoch, PinnedExpert* out) {
  std::lock_guard<std::mutex> lock(acquire_mu_);
  return PinOne(layer, expert, pool, epoch, out);
}

bool ResidencyClient::PinOne(uint32_t layer, uint32_t expert, Pool pool, uint64_t epoch, PinnedExpert* out) {
  // (C1)
  const std::optional<EntryState> s = table_.Read(layer, expert);
  if (!s.has_value() || !s->in(pool)) return false;
  const uint32_t slot = s->slot(pool);
  SlotPins& pins = pool == Pool::kRam ? ram_pins_ : vram_pins_;
  // (C2): Pin ends with a seq_cst fence.
  if (!pins.Pin(slot, segment_->incarnation(), epoch)) return false;
  // (C3)
  if (table_.entry(layer, expert).generation.load(std::memory_order_seq_cst) != s->generation) {
    pins.Unpin(slot, segment_->incarnation());
    ++stats_.raced;
    return false;
  }
  out->layer = layer;
  out->expert = expert;
  out->pool = pool;
  out->slot = slot;
  out->generation = s->generation;
  out->vram_fill = pool == Pool::kVram ? s->vram_fill : 0;
  out->converted = pool == Pool::kVram && (s->tiers & kTierVramConverted) != 0;
  out->bytes = pool == Pool::kRam ? absl::Span<const uint8_t>(segment_->ram_slot(slot)) : absl::Span<const uint8_t>();
  return true;
}

void ResidencyClient::Release(absl::Span<const PinnedExpert> pinned) {
  for (const PinnedExpert& p : pinned) {
    if (p.slot == kNoSlot) continue;
    (p.pool == Pool::kRam ? ram_pins_ : vram_pins_).Unpin(p.slot, segment_->incarnation());
  }
}

absl::Status ResidencyClient::FailAll(absl::Status s, std::vector<PinnedExpert>* out, const std::vector<bool>& done) {
  for (size_t i = 0; i < out->size(); ++i) {
    if (done[i]) Release(absl::MakeConstSpan(&(*out)[i], 1));
  }
  out->clear();
  return s;
}

absl::Status ResidencyClient::Acquire(const Step& step, uint32_t layer, absl::Span<const int32_t> experts,
                                      absl::Time deadline, std::vector<PinnedExpert>* out, Pool pool) {
  std::lock_guard<std::mutex> lock(acquire_mu_);
  if (layer >= table_.n_layer()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm: layer ", layer, " out of range (n_layer ", table_.n_layer(), ")"));
  }
  for (int32_t e : experts) {
    if (e < 0 || static_cast<uint32_t>(e) >= table_.n_expert()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shm: expert ", e, " of layer ", layer, " out of range (n_expert ", table_.n_expert(), ")"));
    }
  }
  // Cheap checks on every call (a hit never waits, so it would never see the peer otherwise): a
  // superseded segment or a restarted residency means the table is no longer maintained.
  const uint64_t residency_now =
      segment_->control().process[static_cast<int>(Role::kResidency)].incarnation.load(std::memory_order_acquire);
  if (segment_->superseded() || residency_now != residency_incarnation_) {
    out->clear();
    return CheckPeer();
  }
  const size_t n = experts.size();
  out->assign(n, PinnedExpert{});
  std::vector<bool> done(n, false), unsent(n, false);
  size_t remaining = n;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t e = static_cast<uint32_t>(experts[i]);
    if (PinOne(layer, e, pool, step.epoch, &(*out)[i])) {
      done[i] = true;
      --remaining;
      ++stats_.hits;
      table_.NoteUse(layer, e, step.epoch, /*hit=*/true);
    } else {
      unsent[i] = true;
      table_.NoteUse(layer, e, step.epoch, /*hit=*/false);
    }
  }
  const uint32_t incarnation_tag = static_cast<uint32_t>(segment_->incarnation());
  // Request counters of this call start here; an error completion for an older request (of a call
  // that gave up) is not this call's business.
  const uint32_t first_request = static_cast<uint32_t>(next_request_ + 1);
  std::vector<DemandRequest> batch;
  std::vector<size_t> batch_index;
  Completion buf[64];
  absl::Time last_scan = absl::Now();
  while (remaining > 0) {
    // Send what is not sent yet (as much as fits; the rest after completions drain).
    batch.clear();
    batch_index.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!unsent[i] || done[i]) continue;
      DemandRequest d{};
      d.layer = layer;
      d.expert = static_cast<uint32_t>(experts[i]);
      d.request_id = (uint64_t{incarnation_tag} << 32) | (++next_request_ & 0xffffffffu);
      d.epoch = step.epoch;
      d.pool = static_cast<uint8_t>(pool);
      batch.push_back(d);
      batch_index.push_back(i);
    }
    if (!batch.empty()) {
      const size_t pushed = demand_.TryPushBatch(batch);
      for (size_t j = 0; j < pushed; ++j) unsent[batch_index[j]] = false;
      stats_.demands += pushed;
    }

    const size_t got = completions_.PopBatch(absl::MakeSpan(buf));
    for (size_t j = 0; j < got; ++j) {
      const Completion& c = buf[j];
      ++stats_.completions;
      if (static_cast<uint32_t>(c.request_id >> 32) != incarnation_tag || c.layer != layer) {
        ++stats_.stale;
        continue;
      }
      const bool older = static_cast<int32_t>(static_cast<uint32_t>(c.request_id) - first_request) < 0;
      if (c.status != 0 && older) {
        ++stats_.stale;
        continue;
      }
      bool matched = false;
      for (size_t i = 0; i < n; ++i) {
        if (done[i] || static_cast<uint32_t>(experts[i]) != c.expert) continue;
        matched = true;
        if (c.status != 0) {
          return FailAll(absl::Status(ToCode(c.status),
                                      absl::StrCat("mer-residency could not load layer ", layer, " expert ", c.expert)),
                         out, done);
        }
        if (PinOne(layer, c.expert, pool, step.epoch, &(*out)[i])) {
          done[i] = true;
          --remaining;
        } else {
          unsent[i] = true;  // evicted again before we pinned it: ask again
        }
      }
      if (!matched) ++stats_.stale;
    }
    if (remaining == 0) break;
    // The deadline holds even while completions keep coming (a peer answering in a loop).
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return FailAll(absl::DeadlineExceededError(absl::StrCat("shm: ", remaining, " of ", n, " experts of layer ",
                                                              layer, " not resident by the deadline")),
                     out, done);
    }
    if (got > 0) continue;

    if (demand_.corrupted() || completions_.corrupted()) {
      return FailAll(absl::DataLossError("shm: a ring's counters are corrupt"), out, done);
    }
    // A VRAM fill (an upload of ~100 us after the request's trip) outlasts the RAM spin: its
    // caller waits on nothing else, so it spins ten times longer before the futex's wake-up cost.
    if (Spin([this] { return completions_.SizeApprox() > 0; }, pool == Pool::kVram ? 20000 : 2000)) continue;
    absl::Status peer = CheckPeer();
    if (!peer.ok()) return FailAll(peer, out, done);
    if (now - last_scan >= options_.poll_interval) {
      // A completion can be lost (e.g. a demand merged with another); the table is the truth.
      last_scan = now;
      for (size_t i = 0; i < n; ++i) {
        if (!done[i] && PinOne(layer, static_cast<uint32_t>(experts[i]), pool, step.epoch, &(*out)[i])) {
          done[i] = true;
          --remaining;
        }
      }
      if (remaining == 0) break;
    }
    absl::Duration wait = std::min(options_.poll_interval, deadline - now);
    bool blocked_on_demand = false;
    for (size_t i = 0; i < n; ++i) blocked_on_demand |= unsent[i] && !done[i];
    if (blocked_on_demand) wait = std::min(wait, absl::Microseconds(200));
    completions_.WaitForData(wait);
  }
  return absl::OkStatus();
}

bool ResidencyClient::SendHint(const Hint& hint) {
  std::lock_guard<std::mutex> lock(hint_mu_);
  if (hints_.TryPush(hint)) return true;
  ++stats_.hints_dropped;
  return false;
}

absl::Status ResidencyClient::ExportVramArena(VramArenaInfo info, absl::Time deadline) {
  info.compute_incarnation = segment_->incarnation();
  VramArenaExport& x = segment_->control().vram_arena;
  ASSIGN_OR_RETURN(const uint64_t sequence, WriteVramArena(x, info, segment_->header().vram_slot_count));
  // mer-residency acts on it within one turn of its loop (a few ms); the peer checks bound the
  // wait when it is gone.
  for (;;) {
    if (const std::optional<absl::StatusCode> code = VramArenaAck(x, sequence); code.has_value()) {
      if (*code == absl::StatusCode::kOk) return absl::OkStatus();
      return absl::Status(*code, absl::StrCat("mer-residency refused the VRAM arena (", absl::StatusCodeToString(*code),
                                              "; its log says why)"));
    }
    RETURN_IF_ERROR(CheckPeer());
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError("mer-residency did not import the VRAM arena in time");
    absl::SleepFor(absl::Milliseconds(1));
  }
}

absl::Status ResidencyClient::WithdrawVramArena(absl::Time deadline) {
  VramArenaExport& x = segment_->control().vram_arena;
  const uint64_t sequence = shm::WithdrawVramArena(x, segment_->incarnation());
  for (;;) {
    if (VramArenaAck(x, sequence).has_value()) return absl::OkStatus();
    RETURN_IF_ERROR(CheckPeer());
    if (absl::Now() >= deadline)
      return absl::DeadlineExceededError("mer-residency did not close the VRAM arena in time");
    absl::SleepFor(absl::Milliseconds(1));
  }
}

// ---------------------------------------------------------------------------------------------

ResidencyEndpoint::ResidencyEndpoint(ShmSegment* segment)
    : segment_(segment),
      table_(segment->table()),
      ram_pins_(segment->pins(Pool::kRam)),
      vram_pins_(segment->pins(Pool::kVram)),
      demand_(segment->demand_ring()),
      hints_(segment->hint_ring()),
      completions_(segment->completion_ring()) {
  CHECK(segment->role() == Role::kResidency);
}

uint64_t ResidencyEndpoint::PublishResident(uint32_t layer, uint32_t expert, uint32_t ram_slot, uint32_t vram_slot,
                                            uint64_t vram_fill, bool ram_device_layout, bool vram_converted) {
  uint32_t tiers = kTierNvme;
  if (ram_slot != kNoSlot) tiers |= ram_device_layout ? kTierRamDevice : kTierRam;
  if (vram_slot != kNoSlot) tiers |= kTierVram | (vram_converted ? kTierVramConverted : 0u);
  return table_.Write(layer, expert, tiers, ram_slot, vram_slot, 0, vram_slot != kNoSlot ? vram_fill : 0);
}

uint64_t ResidencyEndpoint::EvictRam(uint32_t layer, uint32_t expert) {
  const std::optional<EntryState> s = table_.Read(layer, expert);
  const bool vram = s.has_value() && s->in(Pool::kVram);
  const uint32_t tiers = kTierNvme | (vram ? s->tiers & (kTierVram | kTierVramConverted) : 0u);
  return table_.Write(layer, expert, tiers, kNoSlot, vram ? s->vram_slot : kNoSlot, 0, vram ? s->vram_fill : 0);
}

uint64_t ResidencyEndpoint::EvictVram(uint32_t layer, uint32_t expert) {
  const std::optional<EntryState> s = table_.Read(layer, expert);
  const uint32_t ram_bits = s.has_value() ? s->tiers & (kTierRam | kTierRamDevice) : 0u;
  const uint32_t tiers = kTierNvme | ram_bits;
  return table_.Write(layer, expert, tiers, ram_bits != 0 ? s->ram_slot : kNoSlot, kNoSlot);
}

uint64_t ResidencyEndpoint::PublishFailed(uint32_t layer, uint32_t expert, absl::StatusCode code) {
  return table_.Write(layer, expert, kTierNvme | kTierFailed, kNoSlot, kNoSlot, static_cast<uint32_t>(code));
}

bool ResidencyEndpoint::SlotReusable(Pool pool, uint32_t slot) {
  const PeerInfo compute = segment_->Peer();
  return !pins(pool).InUse(slot, compute.incarnation, compute.gone);
}

uint64_t ResidencyEndpoint::MinInflightEpoch() const {
  const SegmentControl& c = segment_->control();
  uint64_t min = c.compute_epoch.load(std::memory_order_seq_cst) + 1;
  for (const auto& e : c.step_epochs) {
    const uint64_t v = e.load(std::memory_order_seq_cst);
    if (v != 0 && v < min) min = v;
  }
  return min;
}

}  // namespace mer::shm
