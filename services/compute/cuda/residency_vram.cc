#include "services/compute/cuda/residency_vram.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/repack.cuh"

namespace mer::cuda {

absl::StatusOr<std::unique_ptr<ResidencyVram>> ResidencyVram::Create(VramResidency& residency, int device,
                                                                     uint8_t* arena, int64_t slot_bytes,
                                                                     int32_t slot_count,
                                                                     std::vector<VramLayerLayout> layouts,
                                                                     uint8_t* staging, int staging_slots) {
  for (size_t l = 0; l < layouts.size(); ++l)
    if (static_cast<int64_t>(layouts[l].raw.bytes) > slot_bytes)
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", l, "'s experts (", layouts[l].raw.bytes, " bytes) exceed a slot"));
  VramArenaDescriptor d;
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == sizeof(d.ipc_handle));
  if (cudaError_t e = cudaIpcGetMemHandle(&handle, arena); e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cudaIpcGetMemHandle of the expert arena: ", cudaGetErrorString(e)));
  }
  std::memcpy(d.ipc_handle.data(), &handle, sizeof(handle));
  char bus[32] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus) - 1, device));
  d.pci_bus_id = bus;
  d.slot_bytes = static_cast<uint64_t>(slot_bytes);
  d.slot_count = static_cast<uint32_t>(slot_count);
  if (absl::Status s = residency.ExportArena(d); !s.ok())
    return absl::Status(s.code(), absl::StrCat("exporting the VRAM arena: ", s.message()));
  std::unique_ptr<ResidencyVram> r(
      new ResidencyVram(residency, arena, slot_bytes, std::move(layouts), staging, staging_slots));
  r->placements_.reserve(slot_count);
  r->fresh_.reserve(slot_count);
  r->repack_jobs_.reserve(3 * static_cast<size_t>(staging_slots));
  std::fprintf(stderr, "cuda: arena exported to mer-residency over CUDA IPC (%s, %d slots x %lld B)\n", bus, slot_count,
               static_cast<long long>(slot_bytes));
  return r;
}

ResidencyVram::~ResidencyVram() {
  // The engine synchronises its stream before it destroys this: nothing reads the slots now.
  // Then mer-residency lets go of the arena before the engine frees it.
  Release();
  residency_.WithdrawArena();
}

absl::StatusOr<int> ResidencyVram::Acquire(int layer, absl::Span<const int32_t> experts, int32_t* table_row,
                                           CUstream_st* stream) {
  placements_.resize(experts.size());
  ASSIGN_OR_RETURN(const int demanded, residency_.AcquireVram(layer, experts, absl::MakeSpan(placements_)));
  held_ = true;
  ++stats_.acquires;
  stats_.demanded += demanded;
  Convert(layer, experts, table_row, stream);
  return demanded;
}

absl::StatusOr<int> ResidencyVram::Place(int layer, absl::Span<const int32_t> experts, int32_t* table_row,
                                         CUstream_st* stream) {
  placements_.resize(experts.size());
  ASSIGN_OR_RETURN(const int demanded, residency_.PinVram(layer, experts, absl::MakeSpan(placements_)));
  ++stats_.acquires;
  stats_.demanded += demanded;
  Convert(layer, experts, table_row, stream);
  return demanded;
}

void ResidencyVram::Convert(int layer, absl::Span<const int32_t> experts, int32_t* table_row, CUstream_st* stream) {
  fresh_.clear();
  for (size_t i = 0; i < experts.size(); ++i) {
    table_row[experts[i]] = placements_[i].slot;
    if (placements_[i].fresh) fresh_.push_back(placements_[i].slot);
  }
  // Fresh fills hold the blob's bytes: copy each to staging, then write gate, up and down at the
  // slot's offsets in the device layout (the repack kernel for the types that have one). All on
  // `stream`, before the kernels that read the slots; a staging slot is reused only after the
  // launches that read it (stream order).
  const VramLayerLayout& L = layouts_[layer];
  const auto places = L.slot.matrices();
  const uint64_t src_off[3] = {L.raw.gate, L.raw.up, L.raw.down};
  for (size_t b = 0; b < fresh_.size(); b += staging_slots_) {
    const size_t n = std::min<size_t>(staging_slots_, fresh_.size() - b);
    repack_jobs_.clear();
    for (size_t j = 0; j < n; ++j) {
      uint8_t* slot = arena_ + int64_t(fresh_[b + j]) * slot_bytes_;
      uint8_t* stage = staging_ + int64_t(j) * slot_bytes_;
      CUDA_CHECK(cudaMemcpyAsync(stage, slot, L.raw.bytes, cudaMemcpyDeviceToDevice, stream));
      for (int i = 0; i < 3; ++i) {
        const ExpertMatrixPlace& m = *places[i];
        if (NeedsRepack(m.type)) {
          repack_jobs_.push_back({static_cast<int>(m.type), {stage + src_off[i], slot + m.offset, m.bytes, m.cols}});
        } else {
          CUDA_CHECK(cudaMemcpyAsync(slot + m.offset, stage + src_off[i], m.bytes, cudaMemcpyDeviceToDevice, stream));
        }
      }
    }
    LaunchRepackByType(repack_jobs_.data(), static_cast<int>(repack_jobs_.size()), stream);
    stats_.converted += static_cast<int64_t>(n);
  }
}

void ResidencyVram::Release() {
  if (!held_) return;
  residency_.ReleaseVram();
  held_ = false;
}

void ResidencyVram::Routed(int layer, absl::Span<const int32_t> experts) {
  if (layer == last_prediction_layer_) {
    for (int32_t e : last_prediction_) {
      ++stats_.predicted;
      if (std::find(experts.begin(), experts.end(), e) != experts.end()) ++stats_.predicted_used;
    }
    last_prediction_layer_ = -1;
  }
  confidence_.assign(experts.size(), 255);
  residency_.HintVram(layer, experts, confidence_, /*predicted=*/false);
}

void ResidencyVram::Predicted(int layer, absl::Span<const int32_t> experts) {
  last_prediction_.assign(experts.begin(), experts.end());
  last_prediction_layer_ = layer;
  // The precision measured so far, with a prior of one hit in two, is what a prediction is worth.
  const double p = (stats_.predicted_used + 1.0) / (stats_.predicted + 2.0);
  confidence_.assign(experts.size(), static_cast<uint8_t>(std::clamp(p * 255.0 + 0.5, 0.0, 255.0)));
  residency_.HintVram(layer, experts, confidence_, /*predicted=*/true);
}

}  // namespace mer::cuda
