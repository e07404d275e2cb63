// main() of the GPU tests: exits 77 (CTest's SKIP_RETURN_CODE) where no CUDA device is usable,
// so the suite passes on GPU-less CI hosts and runs for real on the GPU machine.
#include <gtest/gtest.h>

#include <cstdio>

#include "services/compute/cuda/cuda_engine.h"

int main(int argc, char** argv) {
  if (!mer::CudaEngine::DeviceAvailable()) {
    std::fprintf(stderr, "no CUDA device: skipped\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
