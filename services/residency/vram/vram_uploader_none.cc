// CreateCudaVramUploader in a build without CUDA (MER_CUDA=OFF).
#include "services/residency/vram/vram_uploader.h"

namespace mer::residency {

absl::StatusOr<std::unique_ptr<VramUploader>> CreateCudaVramUploader(void*, uint64_t, int) {
  return absl::UnimplementedError(
      "this mer-residency was built without CUDA (MER_CUDA=OFF): it cannot upload into a VRAM "
      "arena; run mer-compute with --vram-arena compute, or a mer-residency built with CUDA");
}

}  // namespace mer::residency
