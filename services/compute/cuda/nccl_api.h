// NCCL's functions, loaded when the first group of expert ranks on distinct GPUs is made
// (dlopen of libnccl.so.2): NCCL is the device exchange's only user (nccl_exchange.h), so a mer
// built with the cuda backend starts and serves on one GPU also where the loader does not find
// NCCL (the CUDA toolkit keeps it in a lib directory of its own). Its header gives the types.
#pragma once

#include <nccl.h>

#include "absl/status/statusor.h"

namespace mer::cuda {

struct NcclApi {
  decltype(&ncclCommInitAll) CommInitAll;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclGroupStart) GroupStart;
  decltype(&ncclGroupEnd) GroupEnd;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;
};

// The library's functions, loaded once for the process (thread-safe); FailedPrecondition naming
// the library or the function that could not be found.
absl::StatusOr<const NcclApi*> LoadNccl();

}  // namespace mer::cuda
