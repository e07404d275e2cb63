#include "services/residency/daemon/host_pinning.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace mer::residency {
namespace {

// The few CUDA runtime entry points used, by their C signatures (cudaError_t is an int enum).
using GetDeviceCountFn = int (*)(int*);
using HostRegisterFn = int (*)(void*, size_t, unsigned int);
using HostUnregisterFn = int (*)(void*);
using GetErrorStringFn = const char* (*)(int);
constexpr unsigned int kCudaHostRegisterPortable = 1;  // pinned for every CUDA context

}  // namespace

HostPinning HostPinning::Register(void* base, size_t bytes) {
  HostPinning p;
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    p.runtime_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (p.runtime_ != nullptr) break;
  }
  if (p.runtime_ == nullptr) {
    p.reason_ = "no CUDA runtime (libcudart) found";
    return p;
  }
  auto count = reinterpret_cast<GetDeviceCountFn>(dlsym(p.runtime_, "cudaGetDeviceCount"));
  auto reg = reinterpret_cast<HostRegisterFn>(dlsym(p.runtime_, "cudaHostRegister"));
  auto error = reinterpret_cast<GetErrorStringFn>(dlsym(p.runtime_, "cudaGetErrorString"));
  if (count == nullptr || reg == nullptr || error == nullptr) {
    p.reason_ = "libcudart lacks cudaHostRegister";
    return p;
  }
  int devices = 0;
  if (const int rc = count(&devices); rc != 0 || devices == 0) {
    p.reason_ = rc != 0 ? absl::StrCat("no usable GPU (", error(rc), ")") : "no GPU";
    return p;
  }
  if (const int rc = reg(base, bytes, kCudaHostRegisterPortable); rc != 0) {
    p.reason_ =
        absl::StrCat("cudaHostRegister of ", bytes, " bytes failed: ", error(rc), " (is LimitMEMLOCK high enough?)");
    return p;
  }
  p.base_ = base;
  p.pinned_ = true;
  p.reason_ = absl::StrCat("cudaHostRegister, ", devices, " GPU(s)");
  return p;
}

HostPinning::HostPinning(HostPinning&& other) noexcept
    : base_(other.base_), runtime_(other.runtime_), pinned_(other.pinned_), reason_(std::move(other.reason_)) {
  other.base_ = nullptr;
  other.runtime_ = nullptr;
  other.pinned_ = false;
}

HostPinning::~HostPinning() {
  if (pinned_ && runtime_ != nullptr) {
    if (auto unreg = reinterpret_cast<HostUnregisterFn>(dlsym(runtime_, "cudaHostUnregister"))) unreg(base_);
  }
  // The runtime stays loaded: unloading libcudart while its threads may run is not safe.
}

}  // namespace mer::residency
