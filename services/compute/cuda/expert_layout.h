// Where one layer's expert matrices lie in an arena slot of the cuda backend: gate | up | down,
// each of its own type (a file may give the three of a layer three different types, as the CPU
// engine runs them), each starting at a multiple of DeviceBufferTable::kAlign for the kernels'
// 16-byte loads. A matrix keeps its file bytes' count in the device layout (repack.cuh regroups
// bytes, it never resizes), so its size is rows * RowBytes(type, cols).
//
// Host-side only (no CUDA types): CudaEngine sizes its slots with it; the uploads, the checks of
// an expert source's views and the conversion of mer-residency's fills (residency_vram.h) walk a
// layout's matrices, each with its own type.
#pragma once

#include <array>
#include <cstdint>

#include "common/tensor/ggml_type.h"

namespace mer::cuda {

// Types whose device layout differs from the file's (repack.cuh, kquant_repack.cuh): uploaded
// through staging and converted by the repack kernel. Every quantized weight type
// (IsQuantizedWeightType); the float types are used as the file lays them out.
bool NeedsRepack(GgmlType type);

// One matrix of an expert in a slot.
struct ExpertMatrixPlace {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // bytes from the slot's start
  int64_t bytes = 0;   // rows * RowBytes(type, cols)
};

struct ExpertLayout {
  // gate and up: [n_ff rows, n_embd cols]; down: [n_embd rows, n_ff cols]. In slot order.
  ExpertMatrixPlace gate, up, down;

  int64_t end() const { return down.offset + down.bytes; }              // the slot bytes it needs
  int64_t bytes() const { return gate.bytes + up.bytes + down.bytes; }  // the bytes an upload moves
  std::array<const ExpertMatrixPlace*, 3> matrices() const { return {&gate, &up, &down}; }
};

ExpertLayout ExpertLayoutFor(GgmlType gate, GgmlType up, GgmlType down, int64_t n_embd, int64_t n_ff);

}  // namespace mer::cuda
