// Element i of a row in the GGUF layout (blocks.h) of the quantized types other than Q8_0, to f32
// as the CPU's DequantizeRow* compute it (the embedding table stays in the file's layout).
// Q4_K: d_j = d * sc_j and min_j = dmin * m_j, then d_j * q - min_j, which GCC contracts into one
// fma (C++ with -mfma); either way the same float, since d_j * q is exact (an f16 mantissa times 6
// and 4 bits). Q6_K: (d * sc_j) * (q - 32), in that order (the second product rounds). Q5_K, Q2_K,
// Q4_1, Q5_1: as Q4_K (their products are exact too). The others are products only (IQ1_S's of an
// exact sum), in the CPU's order (each function says it). All but Q4_K and Q6_K are
// __host__ __device__, so the host test (kquant_layout_test) runs them as they are.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/kquant_layout.cuh"

namespace mer::cuda {

// f16 bits to f32 on host and device.
__host__ __device__ inline float HalfBitsToFloat(uint16_t bits) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(bits));
#else
  const uint32_t sign = (bits & 0x8000u) << 16, exp = (bits >> 10) & 0x1f, mant = bits & 0x3ffu;
  float f;
  if (exp == 0) {
    f = static_cast<float>(mant) * 5.9604644775390625e-8f;  // subnormal: mant * 2^-24, exact
  } else {
    const uint32_t u = exp == 31 ? 0x7f800000u | (mant << 13) : ((exp + 112) << 23) | (mant << 13);
    __builtin_memcpy(&f, &u, 4);
  }
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  u |= sign;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

__host__ __device__ inline float HalfAt(const uint8_t* p) {
  return HalfBitsToFloat(static_cast<uint16_t>(p[0] | (p[1] << 8)));
}

#if defined(__CUDACC__)  // device intrinsics; the host test reimplements these two
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
#endif

__host__ __device__ inline float DequantQ5_K(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kKBlock) * kQ5_KBlockBytes;
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
  const uint8_t qb = blk[48 + 32 * chunk + e % 32];
  const int q = (high ? qb >> 4 : qb & 0xF) | (((blk[16 + e % 32] >> j) & 1) << 4);
  const float dj = HalfAt(blk) * static_cast<float>(sc);
  const float mj = HalfAt(blk + 2) * static_cast<float>(m);
  return fmaf(dj, static_cast<float>(q), -mj);
}

// kIQ4Values[q] through IQ4Lookup4 (kquant_layout.cuh).
__host__ __device__ inline float DequantIQ4_XS(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kKBlock) * kIQ4_XSBlockBytes;
  const int e = static_cast<int>(i % kKBlock), j = e / 32, k = e % 32;
  const int code = (blk[8 + 16 * j + k % 16] >> (k < 16 ? 0 : 4)) & 0xF;
  const int value = static_cast<int8_t>(IQ4Lookup4(static_cast<uint32_t>(code)) & 0xffu);
  const int scales_h = blk[2] | (blk[3] << 8);
  const int ls = ((blk[4 + j / 2] >> (4 * (j % 2))) & 0xF) | (((scales_h >> (2 * j)) & 3) << 4);
  return HalfAt(blk) * static_cast<float>(ls - 32) * static_cast<float>(value);
}

// Q3_K: (d * (sc - 32)) * q; Q2_K: (d * sc) * q - dmin * m (the product exact).
__host__ __device__ inline float DequantQ3_K(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kKBlock) * kQ3_KBlockBytes;
  const int e = static_cast<int>(i % kKBlock), h = e / 128, s = (e % 128) / 32, l = e % 32, j = e / 16;
  const int low = (blk[32 + 32 * h + l] >> (2 * s)) & 3;
  const int q = (blk[l] >> (4 * h + s)) & 1 ? low : low - 4;
  const uint8_t* scales = blk + 96;
  const int code = (j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4) | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
  return HalfAt(blk + 108) * static_cast<float>(code - 32) * static_cast<float>(q);
}
__host__ __device__ inline float DequantQ2_K(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kKBlock) * kQ2_KBlockBytes;
  const int e = static_cast<int>(i % kKBlock), h = e / 128, s = (e % 128) / 32, l = e % 32, j = e / 16;
  const int q = (blk[16 + 32 * h + l] >> (2 * s)) & 3;
  const float dj = HalfAt(blk + 80) * static_cast<float>(blk[j] & 0xF);
  const float mj = HalfAt(blk + 82) * static_cast<float>(blk[j] >> 4);
  return fmaf(dj, static_cast<float>(q), -mj);
}

// Q4_1 / Q5_1: q * d + m (the product exact).
template <bool kFive>
__host__ __device__ inline float DequantQ5_1(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kTable4Block) * (kFive ? kQ5_1BlockBytes : kQ4_1BlockBytes);
  const int e = static_cast<int>(i % kTable4Block);
  const uint8_t* qs = blk + (kFive ? 8 : 4);
  int code = (qs[e % 16] >> (e < 16 ? 0 : 4)) & 0xF;
  if (kFive) {
    const uint32_t qh = blk[4] | (blk[5] << 8) | (blk[6] << 16) | (static_cast<uint32_t>(blk[7]) << 24);
    code |= ((qh >> e) & 1) << 4;
  }
  return fmaf(static_cast<float>(code), HalfAt(blk), HalfAt(blk + 2));
}

// Q5_0: (q - 16) * d.
__host__ __device__ inline float DequantQ5_0(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kTable4Block) * kQ5_0BlockBytes;
  const int e = static_cast<int>(i % kTable4Block);
  const uint32_t qh = blk[2] | (blk[3] << 8) | (blk[4] << 16) | (static_cast<uint32_t>(blk[5]) << 24);
  const int code = ((blk[6 + e % 16] >> (e < 16 ? 0 : 4)) & 0xF) | (((qh >> e) & 1) << 4);
  return static_cast<float>(code - 16) * HalfAt(blk);
}

// Q4_0: (q - 8) * d; IQ4_NL: d * kIQ4Values[q] (through IQ4Lookup4).
template <bool kIQ4>
__host__ __device__ inline float DequantTable4(const uint8_t* row, int64_t i) {
  const uint8_t* blk = row + (i / kTable4Block) * kTable4BlockBytes;
  const int e = static_cast<int>(i % kTable4Block);
  const int code = (blk[2 + e % 16] >> (e < 16 ? 0 : 4)) & 0xF;
  if (kIQ4)
    return HalfAt(blk) * static_cast<float>(static_cast<int8_t>(IQ4Lookup4(static_cast<uint32_t>(code)) & 0xffu));
  return static_cast<float>(code - 8) * HalfAt(blk);
}

// grid: the 512 grid points (kIQ2_XSGrid). ((d * (0.5 + ls)) * 0.25) * grid byte, then the sign.
__host__ __device__ inline float DequantIQ2_XS(const uint8_t* row, int64_t i, const uint64_t* grid) {
  const uint8_t* blk = row + (i / kKBlock) * kIQ2_XSBlockBytes;
  const int e = static_cast<int>(i % kKBlock), group = e / 8, k = e % 8;
  const uint32_t q = blk[2 + 2 * group] | (blk[3 + 2 * group] << 8);
  const int ls = (blk[66 + group / 4] >> (4 * ((group / 2) % 2))) & 0xF;
  const float db = HalfAt(blk) * (0.5f + static_cast<float>(ls)) * 0.25f;
  const uint32_t s7 = q >> 9, signs = s7 | (static_cast<uint32_t>(Popc(s7) & 1) << 7);
  const int magnitude = static_cast<int>((grid[q & 511u] >> (8 * k)) & 0xffu);
  return db * static_cast<float>(magnitude) * ((signs >> k) & 1 ? -1.0f : 1.0f);
}

// grid: the 256 grid points (kIQ3_XXSGrid). ((d * (0.5 + ls)) * 0.5) * grid byte, then the sign.
__host__ __device__ inline float DequantIQ3_XXS(const uint8_t* row, int64_t i, const uint32_t* grid) {
  const uint8_t* blk = row + (i / kKBlock) * kIQ3_XXSBlockBytes;
  const int e = static_cast<int>(i % kKBlock), j = e / 32, l = (e % 32) / 8, k = e % 8;
  const uint8_t* w = blk + 66 + 4 * j;
  const uint32_t word = w[0] | (w[1] << 8) | (w[2] << 16) | (static_cast<uint32_t>(w[3]) << 24);
  const float db = HalfAt(blk) * (0.5f + static_cast<float>(word >> 28)) * 0.5f;
  const uint32_t s7 = (word >> (7 * l)) & 127u, signs = s7 | (static_cast<uint32_t>(Popc(s7) & 1) << 7);
  const int magnitude = static_cast<int>((grid[blk[2 + 8 * j + 2 * l + k / 4]] >> (8 * (k % 4))) & 0xffu);
  return db * static_cast<float>(magnitude) * ((signs >> k) & 1 ? -1.0f : 1.0f);
}

// grid: the 512 grid points (kIQ3_SGrid). (d * (1 + 2 ls)) * grid byte, then the sign. A block: d,
// qs at 2, qh at 66, signs at 74, scales at 106.
__host__ __device__ inline float DequantIQ3_S(const uint8_t* row, int64_t i, const uint32_t* grid) {
  const uint8_t* blk = row + (i / kKBlock) * kIQ3_SBlockBytes;
  const int e = static_cast<int>(i % kKBlock), j = e / 32, k = (e % 32) / 4;
  const int index = blk[2 + 8 * j + k] | (((blk[66 + j] >> k) & 1) << 8);
  const int ls = (blk[106 + j / 2] >> (4 * (j % 2))) & 0xF;
  const float db = HalfAt(blk) * static_cast<float>(1 + 2 * ls);
  const int magnitude = static_cast<int>((grid[index] >> (8 * (e % 4))) & 0xffu);
  const bool negative = (blk[74 + 4 * j + (e % 32) / 8] >> (e % 8)) & 1;
  return db * static_cast<float>(magnitude) * (negative ? -1.0f : 1.0f);
}

// grid: the 1024 grid points (kIQ2_SGrid). ((d * (0.5 + ls)) * 0.25) * grid byte, then the sign.
// A block: d, grid indices at 2, signs at 34, qh at 66, scales at 74.
__host__ __device__ inline float DequantIQ2_S(const uint8_t* row, int64_t i, const uint64_t* grid) {
  const uint8_t* blk = row + (i / kKBlock) * kIQ2_SBlockBytes;
  const int e = static_cast<int>(i % kKBlock), group = e / 8, k = e % 8;
  const int index = blk[2 + group] | (((blk[66 + group / 4] >> (2 * (group % 4))) & 3) << 8);
  const int ls = (blk[74 + group / 4] >> (4 * ((group / 2) % 2))) & 0xF;
  const float db = HalfAt(blk) * (0.5f + static_cast<float>(ls)) * 0.25f;
  const int magnitude = static_cast<int>((grid[index] >> (8 * k)) & 0xffu);
  return db * static_cast<float>(magnitude) * ((blk[34 + group] >> k) & 1 ? -1.0f : 1.0f);
}

// grid: the 2048 grid points (kIQ1_SGrid). (d * (2 ls + 1)) * (grid value + delta), the sum exact.
// A block: d, grid indices at 2, qh (u16) at 34.
__host__ __device__ inline float DequantIQ1_S(const uint8_t* row, int64_t i, const uint64_t* grid) {
  const uint8_t* blk = row + (i / kKBlock) * kIQ1_SBlockBytes;
  const int e = static_cast<int>(i % kKBlock), j = e / 32, group = e / 8, k = e % 8;
  const int qh = blk[34 + 2 * j] | (blk[35 + 2 * j] << 8);
  const int index = blk[2 + group] | (((qh >> (3 * (group % 4))) & 7) << 8);
  const float dl = HalfAt(blk) * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
  const float delta = qh & 0x8000 ? -kIQ1_SDelta : kIQ1_SDelta;
  const int value = static_cast<int8_t>((grid[index] >> (8 * k)) & 0xffu);
  return dl * (static_cast<float>(value) + delta);
}

// grid: the 256 grid points (kIQ2_XXSGrid).
__host__ __device__ inline float DequantIQ2_XXS(const uint8_t* row, int64_t i, const uint64_t* grid) {
  const uint8_t* blk = row + (i / kKBlock) * kIQ2_XXSBlockBytes;
  const int e = static_cast<int>(i % kKBlock), j = e / 32, l = (e % 32) / 8, k = e % 8;
  const uint8_t* sub = blk + 2 + 8 * j;
  const uint32_t a1 = sub[4] | (sub[5] << 8) | (sub[6] << 16) | (static_cast<uint32_t>(sub[7]) << 24);
  const float db = HalfAt(blk) * (0.5f + static_cast<float>(a1 >> 28)) * 0.25f;
  const uint32_t s7 = (a1 >> (7 * l)) & 127u;
  const uint32_t signs = s7 | (static_cast<uint32_t>(Popc(s7) & 1) << 7);
  const int magnitude = static_cast<int>((grid[sub[l]] >> (8 * k)) & 0xffu);
  return db * static_cast<float>(magnitude) * ((signs >> k) & 1 ? -1.0f : 1.0f);
}

}  // namespace mer::cuda
