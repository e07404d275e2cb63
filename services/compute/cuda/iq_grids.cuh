// The IQ formats' grids in device memory, for the kernels that decode IQ2_XXS (kquant_dot.cuh):
// the same data as the CPU's tables (common/quant/iq2_grids.cc). Each translation unit that
// includes this has its own copy (2 KiB), read through the L1 cache.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

__device__ const uint64_t kDevIQ2_XXSGrid[256] = {
#include "common/quant/iq2_xxs_grid.inc"
};

}  // namespace mer::cuda
