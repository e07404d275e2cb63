// An ExpertSource backed by mer-residency: AcquireLayer asks the daemon (through the segment's
// ResidencyClient) for the layer's experts, pins their RAM slots and hands out ExpertStore views
// over the pinned bytes; ReleaseLayer unpins them.
//
// Steps: one shm step per acquired layer (BeginStep in AcquireLayer, EndStep in ReleaseLayer),
// the simplest correct mapping of the engine's per-layer acquire/release onto the protocol's
// epochs. After acquiring a layer a "routed" Hint with its experts is sent (best effort), which
// mer-residency's predictor learns from when it prefetches.
//
// Failures: Unavailable (mer-residency died, restarted or superseded the segment) makes the source
// re-attach by name (ResidencyClient::Reconnect, up to reconnect_timeout) and retry the layer
// once; any other error, or a second failure, is returned (the engine passes it up). DataLoss
// names the expert whose blob failed verification.
//
// Page-locking the RAM tier for the engine's uploads (options.pin_ram_tier): mer-residency may
// cudaHostRegister the RAM tier in its own process, but registration belongs to a process's
// address space, so this process's mapping of the same pages is pageable to its own CUDA context
// (uploads from it go through the driver's staging at about a third of the pinned rate). A backend
// that uploads from the views (cuda) therefore gives a pinner, and every segment the source
// attaches has its RAM tier registered here too, once, at attach (the physical pages are then
// locked by both processes, which costs no memory), and unregistered before it is unmapped.
//
// The VRAM tier (VramResidency, for the cuda backend's arena over CUDA IPC): ExportArena publishes
// the arena compute allocated and re-publishes it into every segment the source re-attaches to;
// AcquireVram pins VRAM slots for one shm step per call, released together by ReleaseVram. Which
// fills compute has converted to its device layout is tracked per slot here (a fill number is
// unique within one segment, so the record is cleared at re-attachment).
//
// Thread-safety: one thread at a time: the engine's Forward, or on the cuda backend's device path
// (misses decided on the device) the miss service's thread, which then does all the VRAM calls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/expert_source.h"
#include "common/shm/client.h"
#include "common/shm/segment.h"
#include "common/store/expert_store.h"
#include "services/compute/vram_residency.h"

namespace mer {

struct ResidencyExpertSourceOptions {
  // Longest wait for one layer's experts.
  absl::Duration acquire_timeout = absl::Seconds(30);
  // Longest wait for mer-residency at Connect and when re-attaching after Unavailable.
  absl::Duration reconnect_timeout = absl::Seconds(10);
  // Send a routed Hint per acquired layer.
  bool send_hints = true;
  // Page-locks each attached segment's RAM tier in this process (above); empty: left pageable
  // (the cpu backend reads the slots in place and needs no DMA).
  HostMemoryPinner pin_ram_tier;
  shm::ClientOptions client;
};

// What the compute side saw, summed over every client it used (reconnections included).
struct ResidencySourceStats {
  shm::ClientStats client;
  uint64_t layers = 0;      // AcquireLayer calls that succeeded
  uint64_t experts = 0;     // experts handed out
  uint64_t reconnects = 0;  // re-attachments after Unavailable
};

class ResidencyExpertSource final : public ExpertSource, public VramResidency {
 public:
  // Attaches to instance `name` (waiting up to reconnect_timeout for mer-residency to create it).
  // `store` is the store mer-residency serves (its manifest gives the segment identity and the
  // views' layout) and outlives the source.
  static absl::StatusOr<std::unique_ptr<ResidencyExpertSource>> Connect(
      const ExpertStore& store, const std::string& name, const ResidencyExpertSourceOptions& options = {});
  ~ResidencyExpertSource() override;

  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override;
  void ReleaseLayer(int layer) override;
  // Half the RAM tier's slots (at least one): what one acquire may pin while leaving the daemon
  // room for another client's step and for prefetch.
  int max_experts_per_acquire() const override;
  // From the store's manifest.
  std::optional<ExpertTypes> expert_types(int layer) const override;

  // VramResidency.
  uint32_t max_vram_slots() const override { return segment_->header().vram_slot_count; }
  RawExpertOffsets raw_offsets(int layer) const override;
  absl::Status ExportArena(const VramArenaDescriptor& arena) override;
  void WithdrawArena() override;
  absl::StatusOr<int> AcquireVram(int layer, absl::Span<const int32_t> experts, absl::Span<VramPlacement> out) override;
  void ReleaseVram() override;
  void HintVram(int layer, absl::Span<const int32_t> experts, absl::Span<const uint8_t> confidence,
                bool predicted) override;
  absl::StatusOr<int> PinVram(int layer, absl::Span<const int32_t> experts, absl::Span<VramPlacement> out) override;
  void UnpinVram(int layer, int32_t expert) override;
  uint64_t attachment() const override { return attachments_; }

  ResidencySourceStats stats() const;
  // Bytes of mer-residency's RAM tier (slots x slot size) in the segment attached now.
  uint64_t ram_tier_bytes() const {
    return segment_ ? segment_->header().ram_slot_count * segment_->header().ram_slot_bytes : 0;
  }
  std::string FormatStats() const;
  // How the RAM tier of the segment attached now is mapped for DMA: "pinned: ..." (bytes and
  // time of the registration), "pageable: WHY", or "not pinned" without a pinner.
  const std::string& ram_tier_pinning() const { return pinning_; }
  bool ram_tier_pinned() const { return ram_pin_ != nullptr; }

 private:
  struct Held {
    shm::ResidencyClient* client = nullptr;
    shm::Step step;
    std::vector<shm::PinnedExpert> pinned;
  };
  ResidencyExpertSource(const ExpertStore& store, std::string name, const ResidencyExpertSourceOptions& options)
      : store_(store), name_(std::move(name)), options_(options) {}
  absl::Status Attach();
  absl::Status TryAcquire(int layer, absl::Span<const int32_t> experts, Held* held);
  // Registers `segment`'s RAM tier with options_.pin_ram_tier (sets pinning_); null when not pinned.
  std::shared_ptr<void> PinRamTier(const shm::ShmSegment& segment);
  absl::Status TryAcquireVram(int layer, absl::Span<const int32_t> experts, Held* held);
  // AcquireVram and PinVram: pins experts of `layer` (re-attaching and retrying once after
  // Unavailable) into *held and writes out; returns how many were demanded.
  absl::StatusOr<int> AcquireVramInto(int layer, absl::Span<const int32_t> experts, absl::Span<VramPlacement> out,
                                      Held* held);
  // Drops the clients replaced by a reconnection once nothing they pinned is held.
  void DropOldClients();

  const ExpertStore& store_;
  const std::string name_;
  const ResidencyExpertSourceOptions options_;
  std::unique_ptr<shm::ShmSegment> segment_;
  std::unique_ptr<shm::ResidencyClient> client_;
  std::shared_ptr<void> ram_pin_;  // segment_'s RAM tier registration, released before segment_
  std::string pinning_ = "not pinned";
  // Clients (and segments, and their registrations) replaced by a reconnection, kept while layers
  // they pinned are held.
  std::vector<std::unique_ptr<shm::ShmSegment>> old_segments_;
  std::vector<std::unique_ptr<shm::ResidencyClient>> old_clients_;
  std::vector<std::shared_ptr<void>> old_pins_;
  std::map<int, Held> held_;
  std::vector<Held> vram_held_;  // acquired since the last ReleaseVram
  // PinVram's pins, by (layer, expert), each until UnpinVram; voided by a re-attachment.
  struct LongPin {
    shm::ResidencyClient* client = nullptr;
    shm::PinnedExpert pinned;
  };
  std::map<std::pair<int, int32_t>, LongPin> long_pins_;
  uint64_t attachments_ = 0;
  std::optional<VramArenaDescriptor> arena_;  // exported, to re-export after a re-attachment
  std::vector<uint64_t> converted_fill_;      // per VRAM slot: the fill compute converted, 0 = none
  shm::ClientStats retired_stats_;            // of clients replaced
  uint64_t layers_ = 0, experts_ = 0, reconnects_ = 0;
};

}  // namespace mer
