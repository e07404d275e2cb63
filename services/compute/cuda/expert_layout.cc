#include "services/compute/cuda/expert_layout.h"

#include "services/compute/cuda/device_buffers.h"

namespace mer::cuda {

bool NeedsRepack(GgmlType t) { return IsQuantizedWeightType(t); }

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
