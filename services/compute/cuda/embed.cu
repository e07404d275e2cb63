#include "services/compute/cuda/embed.cuh"

#include <cuda_fp16.h>

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/iq_grids.cuh"
#include "services/compute/cuda/kquant_dequant.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

__device__ __forceinline__ float EmbedValue(int type, const uint8_t* row, int64_t i) {
  switch (type) {
    case kDevF32:
      return reinterpret_cast<const float*>(row)[i];
    case kDevF16:
      return __half2float(reinterpret_cast<const __half*>(row)[i]);
    case kDevBF16:
      return BF16BitsToF32(reinterpret_cast<const uint16_t*>(row)[i]);
    case kDevQ4_K:
      return DequantQ4_K(row, i);
    case kDevQ2_K:
      return DequantQ2_K(row, i);
    case kDevQ3_K:
      return DequantQ3_K(row, i);
    case kDevQ5_K:
      return DequantQ5_K(row, i);
    case kDevQ6_K:
      return DequantQ6_K(row, i);
    case kDevIQ4_XS:
      return DequantIQ4_XS(row, i);
    case kDevIQ2_XXS:
      return DequantIQ2_XXS(row, i, kDevIQ2_XXSGrid);
    case kDevIQ2_XS:
      return DequantIQ2_XS(row, i, kDevIQ2_XSGrid);
    case kDevIQ3_XXS:
      return DequantIQ3_XXS(row, i, kDevIQ3_XXSGrid);
    case kDevIQ3_S:
      return DequantIQ3_S(row, i, kDevIQ3_SGrid);
    case kDevIQ2_S:
      return DequantIQ2_S(row, i, kDevIQ2_SGrid);
    case kDevIQ1_S:
      return DequantIQ1_S(row, i, kDevIQ1_SGrid);
    case kDevQ4_0:
      return DequantTable4<false>(row, i);
    case kDevIQ4_NL:
      return DequantTable4<true>(row, i);
    case kDevQ5_0:
      return DequantQ5_0(row, i);
    case kDevQ4_1:
      return DequantQ5_1<false>(row, i);
    case kDevQ5_1:
      return DequantQ5_1<true>(row, i);
    default: {  // Q8_0: block b = 2 bytes of f16 scale, then 32 int8
      const uint8_t* blk = row + (i / 32) * 34;
      const __half d = __ushort_as_half(static_cast<unsigned short>(blk[0] | (blk[1] << 8)));
      return __half2float(d) * static_cast<float>(static_cast<int8_t>(blk[2 + i % 32]));
    }
  }
}

// A block per token. Each thread loads kPerPass elements before it stores any: a store to x may
// alias the table (as bytes), so a load after it would wait for it (a DRAM round trip per element).
__global__ void EmbedKernel(int type, const uint8_t* table, int64_t row_bytes, const int32_t* tokens, int64_t n,
                            float* x) {
  constexpr int kPerPass = 8;
  AllowDependents();
  WaitForPredecessor();
  const int64_t t = blockIdx.x;
  const uint8_t* row = table + int64_t(tokens[t]) * row_bytes;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += int64_t(kPerPass) * blockDim.x) {
    float v[kPerPass];
#pragma unroll
    for (int k = 0; k < kPerPass; ++k) {
      const int64_t i = i0 + int64_t(k) * blockDim.x;
      v[k] = i < n ? EmbedValue(type, row, i) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kPerPass; ++k) {
      const int64_t i = i0 + int64_t(k) * blockDim.x;
      if (i < n) x[t * n + i] = v[k];
    }
  }
}

}  // namespace

void LaunchEmbed(int type, const uint8_t* table, int64_t row_bytes, const int32_t* tokens, int n_tokens, int64_t n,
                 float* x, cudaStream_t stream) {
  LaunchPdl(EmbedKernel, dim3(n_tokens), dim3(256), 0, stream, type, table, row_bytes, tokens, n, x);
}

}  // namespace mer::cuda
