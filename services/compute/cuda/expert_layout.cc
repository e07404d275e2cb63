#include "services/compute/cuda/expert_layout.h"

#include "services/compute/cuda/device_buffers.h"

namespace mer::cuda {

bool NeedsRepack(GgmlType t) {
  switch (t) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
    case GgmlType::kIQ2_XXS:
    case GgmlType::kIQ2_XS:
    case GgmlType::kIQ2_S:
    case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ1_S:
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kIQ4_NL:
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return true;
    default:
      return false;
  }
}

ExpertLayout ExpertLayoutFor(GgmlType gate, GgmlType up, GgmlType down, int64_t n_embd, int64_t n_ff) {
  const auto place = [](GgmlType type, int64_t rows, int64_t cols, int64_t offset) {
    return ExpertMatrixPlace{type, rows, cols, offset, rows * RowBytes(type, cols)};
  };
  ExpertLayout l;
  l.gate = place(gate, n_ff, n_embd, 0);
  l.up = place(up, n_ff, n_embd, DeviceBufferTable::AlignUp(l.gate.offset + l.gate.bytes));
  l.down = place(down, n_embd, n_ff, DeviceBufferTable::AlignUp(l.up.offset + l.up.bytes));
  return l;
}

}  // namespace mer::cuda
