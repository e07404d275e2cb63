// Device-side conversion of f32 values to the activation types of device_layout.cuh.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"

namespace mer::cuda {

// f32 -> bf16 rounding exactly as common/tensor/half.h (and ggml): add 0x7fff + lsb, quiet NaNs.
__device__ inline uint16_t F32ToBF16Bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}
__device__ inline float BF16BitsToF32(uint16_t h) { return __uint_as_float(uint32_t{h} << 16); }

// The activation types StoreAct writes (Q8_K quantizes whole 256-element blocks: kquant_quantize.cuh).
__host__ __device__ inline bool StoreActWrites(int type) {
  return type == kDevF32 || type == kDevF16 || type == kDevBF16 || type == kDevQ8_0;
}

// Stores activation element i of one row. For Q8_0 the 32 lanes of a warp must call it together
// with i = 32 * b + lane (one Q8_0 block per warp call); the quantization is ggml's x86
// quantize_row_q8_0 (common/quant/q8_0.cc): d = amax / 127, q = round-half-even(x * 127 / amax).
__device__ inline void StoreAct(const DevAct& a, int64_t row, int64_t i, float v) {
  uint8_t* base = a.data + row * ActRowBytes(a.type, a.stride);
  switch (a.type) {
    case kDevF32:
      reinterpret_cast<float*>(base)[i] = v;
      break;
    case kDevF16:
      reinterpret_cast<__half*>(base)[i] = __float2half_rn(v);
      break;
    case kDevBF16:
      reinterpret_cast<uint16_t*>(base)[i] = F32ToBF16Bits(v);
      break;
    case kDevQ8_0: {
      float amax = fabsf(v);
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      const float d = amax / 127.0f;
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      const int q = __float2int_rn(__fmul_rn(v, id));
      reinterpret_cast<int8_t*>(base)[Q8_0QuantOffset(i, a.stride / 32)] = static_cast<int8_t>(max(-128, min(127, q)));
      if ((i & 31) == 0) a.scales[row * (a.stride / 32) + i / 32] = __half2float(__float2half_rn(d));
      break;
    }
  }
}

}  // namespace mer::cuda
