// Page-locks the RAM tier for DMA when the host has an NVIDIA GPU: cudaHostRegister on the slot
// pool, so RAM -> VRAM uploads run at the pinned PCIe rate (55 GB/s on the reference host against
// 20 GB/s pageable). The CUDA runtime is loaded with dlopen at run time, not linked: mer-residency
// runs unchanged on GPU-less hosts and needs no CUDA toolkit to build.
//
// Pinning is best effort: without a GPU, a loadable runtime or enough RLIMIT_MEMLOCK the pool
// stays pageable and the reason says why (the daemon logs it and carries on).
#pragma once

#include <cstddef>
#include <string>

namespace mer::residency {

class HostPinning {
 public:
  // Tries to register [base, base + bytes). pinned() tells whether it worked; reason() says why
  // not (or which runtime pinned it).
  static HostPinning Register(void* base, size_t bytes);
  HostPinning(HostPinning&& other) noexcept;
  HostPinning& operator=(HostPinning&&) = delete;
  ~HostPinning();  // unregisters

  bool pinned() const { return pinned_; }
  const std::string& reason() const { return reason_; }

 private:
  HostPinning() = default;
  void* base_ = nullptr;
  void* runtime_ = nullptr;  // dlopen handle of libcudart
  bool pinned_ = false;
  std::string reason_;
};

}  // namespace mer::residency
