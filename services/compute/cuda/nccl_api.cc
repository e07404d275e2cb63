#include "services/compute/cuda/nccl_api.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace mer::cuda {
namespace {

absl::StatusOr<NcclApi> Load() {
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(
        absl::StrCat("NCCL, which expert ranks on distinct GPUs exchange through, could not be loaded (",
                     why != nullptr ? why : "dlopen libnccl.so.2",
                     "): put the CUDA toolkit's lib directory (the one that holds libnccl.so.2) on "
                     "LD_LIBRARY_PATH, or run the ranks on one GPU (--gpus 0,0,...: they exchange on the host)"));
  }
  NcclApi api{};
  absl::Status missing;
  const auto bind = [&](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
    if (*fn == nullptr && missing.ok())
      missing = absl::FailedPreconditionError(absl::StrCat("libnccl.so.2 has no ", name, " (too old an NCCL?)"));
  };
  bind(&api.CommInitAll, "ncclCommInitAll");
  bind(&api.AllReduce, "ncclAllReduce");
  bind(&api.CommAbort, "ncclCommAbort");
  bind(&api.CommDestroy, "ncclCommDestroy");
  bind(&api.GroupStart, "ncclGroupStart");
  bind(&api.GroupEnd, "ncclGroupEnd");
  bind(&api.GetErrorString, "ncclGetErrorString");
  bind(&api.GetLastError, "ncclGetLastError");
  if (!missing.ok()) return missing;
  return api;  // the library stays loaded for the process
}

}  // namespace

absl::StatusOr<const NcclApi*> LoadNccl() {
  static const absl::StatusOr<NcclApi>* loaded = new absl::StatusOr<NcclApi>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace mer::cuda
