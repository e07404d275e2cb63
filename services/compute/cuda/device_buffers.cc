#include "services/compute/cuda/device_buffers.h"

#include <cstdint>

#include "common/base/check.h"

namespace mer::cuda {

int64_t DeviceBufferTable::AddEntry(int64_t bytes, const char* what, std::function<void(uint8_t*)> bind) {
  CHECK_MSG(bytes >= 0, what);
  const int64_t offset = end_;
  entries_.push_back({offset, bytes, what, std::move(bind)});
  end_ = offset + AlignUp(bytes);
  return offset;
}

void DeviceBufferTable::Bind(uint8_t* base) const {
  CHECK(end_ == 0 || (base != nullptr && reinterpret_cast<uintptr_t>(base) % kAlign == 0));
  for (const Entry& e : entries_) e.bind(base + e.offset);
}

std::vector<DeviceBufferTable::Extent> DeviceBufferTable::Extents() const {
  std::vector<Extent> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_) out.push_back({e.offset, e.bytes, e.what});
  return out;
}

}  // namespace mer::cuda
