// The IQ formats' grids in device memory, for the kernels that decode IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S and IQ1_S (kquant_dot.cuh, embed.cu): the same data as the CPU's tables
// (common/quant/iq2_grids.cc, iq3_grids.cc, iq1_grids.cc include the same files). Each translation
// unit that includes this has its own copy (33 KiB), read through the L1 cache.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

__device__ const uint64_t kDevIQ2_XXSGrid[256] = {
#include "common/quant/iq2_xxs_grid.inc"
};

__device__ const uint64_t kDevIQ2_XSGrid[512] = {
#include "common/quant/iq2_xs_grid.inc"
};

__device__ const uint32_t kDevIQ3_XXSGrid[256] = {
#include "common/quant/iq3_xxs_grid.inc"
};

__device__ const uint64_t kDevIQ2_SGrid[1024] = {
#include "common/quant/iq2_s_grid.inc"
};

__device__ const uint32_t kDevIQ3_SGrid[512] = {
#include "common/quant/iq3_s_grid.inc"
};

__device__ const uint64_t kDevIQ1_SGrid[2048] = {
#include "common/quant/iq1_s_grid.inc"
};

}  // namespace mer::cuda
