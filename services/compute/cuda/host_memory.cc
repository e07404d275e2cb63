#include "services/compute/cuda/host_memory.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace mer {

absl::StatusOr<std::shared_ptr<void>> CudaRegisterHostMemory(void* base, size_t bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError("no CUDA device is available");
  }
  // Portable: pinned for every context of this process, whichever device the engine runs on.
  const cudaError_t e = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "cudaHostRegister of ", bytes, " bytes failed: ", cudaGetErrorString(e), " (is LimitMEMLOCK high enough?)"));
  }
  return std::shared_ptr<void>(base, [](void* p) {
    // Unregistering is cleanup: a failure (a device already in a sticky error state) is logged,
    // not fatal, since the process is usually exiting or re-attaching then.
    if (const cudaError_t u = cudaHostUnregister(p); u != cudaSuccess) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "cuda: cudaHostUnregister failed: %s\n", cudaGetErrorString(u));
    }
  });
}

}  // namespace mer
