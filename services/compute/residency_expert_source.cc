#include "services/compute/residency_expert_source.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/base/status.h"
#include "common/shm/store_identity.h"

namespace mer {

absl::StatusOr<std::unique_ptr<ResidencyExpertSource>> ResidencyExpertSource::Connect(
    const ExpertStore& store, const std::string& name, const ResidencyExpertSourceOptions& options) {
  std::unique_ptr<ResidencyExpertSource> s(new ResidencyExpertSource(store, name, options));
  RETURN_IF_ERROR(s->Attach());
  return s;
}

ResidencyExpertSource::~ResidencyExpertSource() {
  for (auto& [layer, held] : held_) {
    held.client->Release(held.pinned);
    held.client->EndStep(held.step);
  }
  held_.clear();
  for (Held& h : vram_held_) {
    h.client->Release(h.pinned);
    h.client->EndStep(h.step);
  }
  vram_held_.clear();
  client_.reset();
  old_clients_.clear();
  // Registrations go before the mappings they cover (a later mapping at the same address must
  // not inherit a stale registration).
  ram_pin_.reset();
  old_pins_.clear();
  segment_.reset();
  old_segments_.clear();
}

std::shared_ptr<void> ResidencyExpertSource::PinRamTier(const shm::ShmSegment& segment) {
  const shm::SegmentHeader& h = segment.header();
  if (!options_.pin_ram_tier || h.ram_slot_count == 0) {
    pinning_ = "not pinned";
    return nullptr;
  }
  const size_t bytes = size_t{h.ram_slot_count} * h.ram_slot_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::shared_ptr<void>> pin = options_.pin_ram_tier(segment.ram_slot(0).data(), bytes);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!pin.ok() || *pin == nullptr) {
    pinning_ = absl::StrCat("pageable: ", pin.ok() ? "not registered" : pin.status().message());
    return nullptr;
  }
  pinning_ = absl::StrFormat("pinned: %.2f GiB registered in this process in %.2f s", bytes / 1073741824.0, secs);
  return *std::move(pin);
}

absl::Status ResidencyExpertSource::Attach() {
  const absl::Time deadline = absl::Now() + options_.reconnect_timeout;
  // The name may still refer to a dead daemon's segment until its successor replaces it: attach
  // again until the residency behind the name is alive, or the deadline passes.
  std::unique_ptr<shm::ShmSegment> segment;
  std::unique_ptr<shm::ResidencyClient> client;
  absl::Status last;
  for (;;) {
    auto seg = shm::ResidencyClient::Reconnect(name_, shm::ExpectedSegmentIdentity(store_.manifest()), deadline);
    if (!seg.ok()) {
      last = seg.status();
      break;
    }
    segment = std::move(*seg);
    client = std::make_unique<shm::ResidencyClient>(segment.get(), options_.client);
    last = client->CheckPeer();
    if (last.ok()) break;
    client.reset();
    segment.reset();
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (!last.ok())
    return absl::Status(last.code(), absl::StrCat("mer-residency instance '", name_, "': ", last.message()));
  if (segment->header().ram_slot_bytes < store_.blob_bytes())
    return absl::FailedPreconditionError(
        absl::StrCat("mer-residency instance '", name_, "' has RAM slots smaller than the store's blobs"));
  if (client_ != nullptr) {
    const shm::ClientStats& s = client_->stats();
    retired_stats_.hits += s.hits;
    retired_stats_.demands += s.demands;
    retired_stats_.completions += s.completions;
    retired_stats_.stale += s.stale;
    retired_stats_.raced += s.raced;
    retired_stats_.hints_dropped += s.hints_dropped;
    old_clients_.push_back(std::move(client_));
    old_pins_.push_back(std::move(ram_pin_));
    old_segments_.push_back(std::move(segment_));
  }
  ram_pin_ = PinRamTier(*segment);
  segment_ = std::move(segment);
  client_ = std::move(client);
  ++attachments_;
  // Pins taken in the old segment mean nothing to the new mer-residency (attachment() tells the
  // engine to forget what it published under them).
  for (auto& [key, pin] : long_pins_) pin.client->Release(absl::MakeConstSpan(&pin.pinned, 1));
  long_pins_.clear();
  if (arena_.has_value()) {
    // A new segment (a restarted mer-residency) knows nothing of the arena: export it again.
    // Its fill numbers start over, so what was converted is forgotten too.
    std::fill(converted_fill_.begin(), converted_fill_.end(), 0);
    RETURN_IF_ERROR(ExportArena(*arena_));
  }
  return absl::OkStatus();
}

RawExpertOffsets ResidencyExpertSource::raw_offsets(int layer) const {
  const StoreLayer& l = store_.manifest().layers[layer];
  return RawExpertOffsets{l.gate_offset, l.up_offset, l.down_offset, l.used_bytes()};
}

absl::Status ResidencyExpertSource::ExportArena(const VramArenaDescriptor& arena) {
  shm::VramArenaInfo info;
  info.slot_bytes = arena.slot_bytes;
  info.slot_count = arena.slot_count;
  info.pci_bus_id = arena.pci_bus_id;
  std::copy(arena.ipc_handle.begin(), arena.ipc_handle.end(), info.ipc_handle.begin());
  arena_ = arena;
  converted_fill_.assign(arena.slot_count, 0);
  const absl::Status s = client_->ExportVramArena(info, absl::Now() + options_.reconnect_timeout);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("mer-residency instance '", name_, "': ", s.message()));
  return absl::OkStatus();
}

void ResidencyExpertSource::WithdrawArena() {
  if (!arena_.has_value()) return;
  arena_.reset();
  const absl::Status s = client_->WithdrawVramArena(absl::Now() + options_.reconnect_timeout);
  // A residency that does not answer is dead or gone: it holds no copy into the arena then.
  if (!s.ok()) std::fprintf(stderr, "mer-compute: withdrawing the VRAM arena: %s\n", s.ToString().c_str());
}

absl::Status ResidencyExpertSource::TryAcquireVram(int layer, absl::Span<const int32_t> experts, Held* held) {
  held->client = client_.get();
  ASSIGN_OR_RETURN(held->step, client_->BeginStep());
  const absl::Status s = client_->Acquire(held->step, static_cast<uint32_t>(layer), experts,
                                          absl::Now() + options_.acquire_timeout, &held->pinned, shm::Pool::kVram);
  if (!s.ok()) {
    client_->EndStep(held->step);
    held->pinned.clear();
    held->client = nullptr;
  }
  return s;
}

absl::StatusOr<int> ResidencyExpertSource::AcquireVramInto(int layer, absl::Span<const int32_t> experts,
                                                           absl::Span<VramPlacement> out, Held* held) {
  if (!arena_.has_value()) return absl::FailedPreconditionError("AcquireVram before ExportArena");
  uint64_t demands_before = client_->stats().demands;
  absl::Status s = TryAcquireVram(layer, experts, held);
  if (absl::IsUnavailable(s)) {
    ++reconnects_;
    const absl::Status a = Attach();  // re-exports the arena into the new segment
    if (!a.ok()) return absl::UnavailableError(absl::StrCat(s.message(), "; reconnecting: ", a.message()));
    demands_before = client_->stats().demands;
    s = TryAcquireVram(layer, experts, held);
  }
  if (!s.ok()) return s;
  const int demanded = static_cast<int>(held->client->stats().demands - demands_before);
  for (size_t i = 0; i < experts.size(); ++i) {
    const shm::PinnedExpert& p = held->pinned[i];
    if (p.slot >= converted_fill_.size()) {
      held->client->Release(held->pinned);
      held->client->EndStep(held->step);
      return absl::InternalError(absl::StrCat("layer ", layer, " expert ", experts[i], ": VRAM slot ", p.slot,
                                              " outside the arena of ", converted_fill_.size()));
    }
    out[i].slot = static_cast<int32_t>(p.slot);
    // A fill copied from a demoted RAM copy is in the device layout already (kTierVramConverted).
    out[i].fresh = converted_fill_[p.slot] != p.vram_fill && !p.converted;
    converted_fill_[p.slot] = p.vram_fill;
    // The caller converts a fresh fill before it lets go of the pin: mer-residency may then copy
    // the slot back into RAM as device layout.
    held->client->NoteConverted(p);
  }
  ++layers_;
  experts_ += experts.size();
  return demanded;
}

absl::StatusOr<int> ResidencyExpertSource::AcquireVram(int layer, absl::Span<const int32_t> experts,
                                                       absl::Span<VramPlacement> out) {
  Held held;
  ASSIGN_OR_RETURN(const int demanded, AcquireVramInto(layer, experts, out, &held));
  vram_held_.push_back(std::move(held));
  return demanded;
}

absl::StatusOr<int> ResidencyExpertSource::PinVram(int layer, absl::Span<const int32_t> experts,
                                                   absl::Span<VramPlacement> out) {
  Held held;
  ASSIGN_OR_RETURN(const int demanded, AcquireVramInto(layer, experts, out, &held));
  // The pins outlast the step: its epoch slot is freed now (a slot's safety is its pin alone).
  held.client->EndStep(held.step);
  for (size_t i = 0; i < experts.size(); ++i) {
    const auto [it, inserted] = long_pins_.try_emplace({layer, experts[i]}, LongPin{held.client, held.pinned[i]});
    if (!inserted) held.client->Release(absl::MakeConstSpan(&held.pinned[i], 1));  // pinned already
  }
  return demanded;
}

void ResidencyExpertSource::UnpinVram(int layer, int32_t expert) {
  const auto it = long_pins_.find({layer, expert});
  if (it == long_pins_.end()) return;
  it->second.client->Release(absl::MakeConstSpan(&it->second.pinned, 1));
  long_pins_.erase(it);
}

void ResidencyExpertSource::ReleaseVram() {
  for (Held& h : vram_held_) {
    h.client->Release(h.pinned);
    h.client->EndStep(h.step);
  }
  vram_held_.clear();
  DropOldClients();
}

void ResidencyExpertSource::HintVram(int layer, absl::Span<const int32_t> experts, absl::Span<const uint8_t> confidence,
                                     bool predicted) {
  if (!options_.send_hints || client_ == nullptr) return;
  for (size_t b = 0; b < experts.size(); b += shm::kHintMaxExperts) {
    shm::Hint h{};
    h.layer = static_cast<uint32_t>(layer);
    h.count = static_cast<uint16_t>(std::min<size_t>(shm::kHintMaxExperts, experts.size() - b));
    h.kind = static_cast<uint8_t>(predicted ? shm::HintKind::kPredicted : shm::HintKind::kRouted);
    h.epoch = segment_->control().compute_epoch.load(std::memory_order_relaxed);
    for (int j = 0; j < h.count; ++j) {
      h.experts[j] = static_cast<uint16_t>(experts[b + j]);
      h.confidence[j] = b + j < confidence.size() ? confidence[b + j] : 255;
    }
    client_->SendHint(h);
  }
}

absl::Status ResidencyExpertSource::TryAcquire(int layer, absl::Span<const int32_t> experts, Held* held) {
  held->client = client_.get();
  ASSIGN_OR_RETURN(held->step, client_->BeginStep());
  const absl::Status s = client_->Acquire(held->step, static_cast<uint32_t>(layer), experts,
                                          absl::Now() + options_.acquire_timeout, &held->pinned);
  if (!s.ok()) {
    client_->EndStep(held->step);
    held->pinned.clear();
    held->client = nullptr;
  }
  return s;
}

absl::Status ResidencyExpertSource::AcquireLayer(int layer, absl::Span<const int32_t> experts,
                                                 absl::Span<ExpertWeights> out) {
  if (held_.count(layer) != 0)
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " is acquired already"));
  Held held;
  absl::Status s = TryAcquire(layer, experts, &held);
  if (absl::IsUnavailable(s)) {
    // mer-residency died, restarted or replaced the segment: re-attach and retry once. Layers
    // still held keep their old client (and segment) until released.
    ++reconnects_;
    const absl::Status a = Attach();
    if (!a.ok()) return absl::UnavailableError(absl::StrCat(s.message(), "; reconnecting: ", a.message()));
    s = TryAcquire(layer, experts, &held);
  }
  if (!s.ok()) {
    if (absl::IsDataLoss(s))
      return absl::DataLossError(
          absl::StrCat(s.message(), " (DATA_LOSS: the blob failed its checksum in mer-residency, see its log)"));
    return s;
  }
  for (size_t i = 0; i < experts.size(); ++i) {
    const shm::PinnedExpert& p = held.pinned[i];
    if (p.bytes.size() < store_.blob_bytes()) {
      held.client->Release(held.pinned);
      held.client->EndStep(held.step);
      return absl::InternalError(
          absl::StrCat("layer ", layer, " expert ", experts[i], ": pinned slot smaller than a blob"));
    }
    out[i] = store_.ExpertView(layer, experts[i], p.bytes.data());
  }
  if (options_.send_hints) {
    for (size_t b = 0; b < experts.size(); b += 16) {
      shm::Hint h{};
      h.layer = static_cast<uint32_t>(layer);
      h.count = static_cast<uint16_t>(std::min<size_t>(16, experts.size() - b));
      h.kind = 0;
      h.epoch = held.step.epoch;
      for (int j = 0; j < h.count; ++j) {
        h.experts[j] = static_cast<uint16_t>(experts[b + j]);
        h.confidence[j] = 255;
      }
      held.client->SendHint(h);
    }
  }
  ++layers_;
  experts_ += experts.size();
  held_.emplace(layer, std::move(held));
  return absl::OkStatus();
}

std::optional<ExpertTypes> ResidencyExpertSource::expert_types(int layer) const {
  const StoreLayer& l = store_.manifest().layers[layer];
  return ExpertTypes{l.gate_type, l.up_type, l.down_type};
}

int ResidencyExpertSource::max_experts_per_acquire() const {
  return static_cast<int>(std::max<uint32_t>(1, segment_->header().ram_slot_count / 2));
}

void ResidencyExpertSource::ReleaseLayer(int layer) {
  auto it = held_.find(layer);
  if (it == held_.end()) return;  // the acquire failed: nothing is pinned
  it->second.client->Release(it->second.pinned);
  it->second.client->EndStep(it->second.step);
  held_.erase(it);
  DropOldClients();
}

void ResidencyExpertSource::DropOldClients() {
  if (held_.empty() && vram_held_.empty() && !old_clients_.empty()) {
    old_clients_.clear();
    old_pins_.clear();
    old_segments_.clear();
  }
}

ResidencySourceStats ResidencyExpertSource::stats() const {
  ResidencySourceStats r;
  r.client = retired_stats_;
  if (client_ != nullptr) {
    const shm::ClientStats& s = client_->stats();
    r.client.hits += s.hits;
    r.client.demands += s.demands;
    r.client.completions += s.completions;
    r.client.stale += s.stale;
    r.client.raced += s.raced;
    r.client.hints_dropped += s.hints_dropped;
  }
  r.layers = layers_;
  r.experts = experts_;
  r.reconnects = reconnects_;
  return r;
}

std::string ResidencyExpertSource::FormatStats() const {
  const ResidencySourceStats s = stats();
  return absl::StrCat("layers=", s.layers, " experts=", s.experts, " hits=", s.client.hits,
                      " demands=", s.client.demands, " completions=", s.client.completions, " stale=", s.client.stale,
                      " raced=", s.client.raced, " hints_dropped=", s.client.hints_dropped,
                      " reconnects=", s.reconnects);
}

}  // namespace mer
