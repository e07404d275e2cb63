// Element i of a Q4_K / Q6_K row in the GGUF layout (blocks.h), to f32 as the CPU's
// DequantizeRowQ4_K / DequantizeRowQ6_K compute it (the embedding table stays in the file's
// layout). Q4_K: d_j = d * sc_j and min_j = dmin * m_j, then d_j * q - min_j, which GCC contracts
// into one fma (C++ with -mfma); either way the same float, since d_j * q is exact (an f16
// mantissa times 6 and 4 bits). Q6_K: (d * sc_j) * (q - 32), in that order (the second product
// rounds).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/kquant_layout.cuh"

namespace mer::cuda {

__device__ inline float F16BitsAt(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}

__device__ inline float DequantQ4_K(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kKBlock) * kQ4_KBlockBytes;
  const int e = static_cast<int>(i % kKBlock), chunk = e / 64, high = (e % 64) / 32, j = 2 * chunk + high;
  const uint8_t* scales = blk + 4;
  int sc, m;
  if (j < 4) {
    sc = scales[j] & 63;
    m = scales[j + 4] & 63;
  } else {
    sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
  const uint8_t qb = blk[16 + 32 * chunk + e % 32];
  const int q = high ? qb >> 4 : qb & 0xF;
  const float dj = __fmul_rn(F16BitsAt(blk), static_cast<float>(sc));
  const float mj = __fmul_rn(F16BitsAt(blk + 2), static_cast<float>(m));
  return fmaf(dj, static_cast<float>(q), -mj);
}

__device__ inline float DequantQ6_K(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kKBlock) * kQ6_KBlockBytes;
  const int e = static_cast<int>(i % kKBlock), half = e / 128, group = (e % 128) / 32, l = e % 32;
  const uint8_t ql = blk[64 * half + l + 32 * (group & 1)];
  const int low = group < 2 ? (ql & 0xF) : (ql >> 4);
  const int high = (blk[128 + 32 * half + l] >> (2 * group)) & 3;
  const int sc = static_cast<int8_t>(blk[192 + e / 16]);
  return __fmul_rn(__fmul_rn(F16BitsAt(blk + 208), static_cast<float>(sc)),
                   static_cast<float>((low | (high << 4)) - 32));
}

}  // namespace mer::cuda
