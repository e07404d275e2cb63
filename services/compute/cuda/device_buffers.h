// One table of the buffers the cuda backend carves out of one device allocation: each buffer is
// declared once, with its size and the pointer that receives its address, so the size that is
// allocated and the addresses that are handed out cannot disagree (a geometry whose buffers are
// not multiples of the alignment used to pass the sizing and overrun the allocation).
//
// Host-side bookkeeping only (no CUDA types): the engine allocates bytes() with cudaMalloc and
// calls Bind with the base. Not thread-safe; used at Create.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mer::cuda {

class DeviceBufferTable {
 public:
  // Every buffer starts at a multiple of this (the kernels' widest loads and cp.async need 16;
  // 256 keeps rows of different buffers off each other's cache lines).
  static constexpr int64_t kAlign = 256;
  static int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

  // Declares a buffer of `bytes` (>= 0) named `what` (for the checks' messages); *dst is set by
  // Bind. Returns the buffer's offset from the base.
  template <typename T>
  int64_t Add(T** dst, int64_t bytes, const char* what) {
    return AddEntry(bytes, what, [dst](uint8_t* p) { *dst = reinterpret_cast<T*>(p); });
  }
  // A buffer whose address is used through a callback (e.g. a struct of several arrays).
  int64_t AddEntry(int64_t bytes, const char* what, std::function<void(uint8_t*)> bind);

  // Total bytes to allocate: the end of the last buffer.
  int64_t bytes() const { return end_; }
  int count() const { return static_cast<int>(entries_.size()); }

  // Sets every declared pointer to base + its offset. base must be kAlign-aligned (cudaMalloc's
  // 256-byte alignment) unless bytes() is 0.
  void Bind(uint8_t* base) const;

  struct Extent {
    int64_t offset, bytes;
    std::string what;
  };
  // The buffers in declaration order (for tests and the VRAM report).
  std::vector<Extent> Extents() const;

 private:
  struct Entry {
    int64_t offset, bytes;
    const char* what;
    std::function<void(uint8_t*)> bind;
  };
  std::vector<Entry> entries_;
  int64_t end_ = 0;
};

}  // namespace mer::cuda
