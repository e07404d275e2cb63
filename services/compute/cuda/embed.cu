#include "services/compute/cuda/embed.cuh"

#include <cuda_fp16.h>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/kquant_dequant.cuh"

namespace mer::cuda {
namespace {

__global__ void EmbedKernel(int type, const uint8_t* table, int64_t row_bytes, const int32_t* tokens,
                            int64_t n, float* x) {
  AllowDependents();
  WaitForPredecessor();
  const int64_t t = blockIdx.x;
  const uint8_t* row = table + int64_t(tokens[t]) * row_bytes;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v;
    switch (type) {
      case kDevF32: v = reinterpret_cast<const float*>(row)[i]; break;
      case kDevF16: v = __half2float(reinterpret_cast<const __half*>(row)[i]); break;
      case kDevBF16: v = BF16BitsToF32(reinterpret_cast<const uint16_t*>(row)[i]); break;
      case kDevQ4_K: v = DequantQ4_K(row, i); break;
      case kDevQ6_K: v = DequantQ6_K(row, i); break;
      default: {  // Q8_0: block b = 2 bytes of f16 scale, then 32 int8
        const uint8_t* blk = row + (i / 32) * 34;
        const __half d = __ushort_as_half(static_cast<unsigned short>(blk[0] | (blk[1] << 8)));
        v = __half2float(d) * static_cast<float>(static_cast<int8_t>(blk[2 + i % 32]));
      }
    }
    x[t * n + i] = v;
  }
}

}  // namespace

void LaunchEmbed(int type, const uint8_t* table, int64_t row_bytes, const int32_t* tokens, int n_tokens,
                 int64_t n, float* x, cudaStream_t stream) {
  LaunchPdl(EmbedKernel, dim3(n_tokens), dim3(256), 0, stream, type, table, row_bytes, tokens, n, x);
}

}  // namespace mer::cuda
