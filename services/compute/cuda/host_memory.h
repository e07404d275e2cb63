// Page-locking host memory that the cuda backend uploads experts from, when that memory is not
// the model file's mapping (which CudaEngine::Create registers itself): mer-residency's RAM tier
// as mapped into this process. cudaHostRegister is per process -- mer-residency registering its
// own mapping of the same shared-memory pages does not make this process's mapping pinned -- so
// the compute process registers its mapping itself (ResidencyExpertSourceOptions::pin_ram_tier).
// No CUDA types here (a HostMemoryPinner is a plain std::function).
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"

namespace mer {

// cudaHostRegister(base, bytes, cudaHostRegisterPortable) in this process; the handle calls
// cudaHostUnregister when its last copy is destroyed, which must happen before the memory is
// unmapped. FailedPrecondition without a usable device; ResourceExhausted when the driver refuses
// (RLIMIT_MEMLOCK, memory); the memory then stays pageable.
absl::StatusOr<std::shared_ptr<void>> CudaRegisterHostMemory(void* base, size_t bytes);

}  // namespace mer
