// IEEE half (f16) and bfloat16 conversions, rounding to nearest even exactly as ggml's CPU
// backend does (F16C's vcvtps2ph with rounding mode 0; bf16 by adding 0x7fff + lsb), so that
// activations rounded here match llama.cpp bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace mer {

using f16_bits = uint16_t;   // raw IEEE binary16
using bf16_bits = uint16_t;  // raw bfloat16 (upper half of an f32)

inline float F16ToF32(f16_bits h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

inline f16_bits F32ToF16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, 0);
#else
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs > 0x7f800000) return static_cast<f16_bits>(sign | 0x7e00);   // NaN
  if (abs >= 0x477ff000) return static_cast<f16_bits>(sign | 0x7c00);  // overflow -> inf
  if (abs < 0x38800000) {                                              // subnormal or zero in f16
    if (abs < 0x33000000) return static_cast<f16_bits>(sign);
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14 + (113 - e)
    uint32_t half = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<f16_bits>(sign | half);
  }
  uint32_t half = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<f16_bits>(sign | half);
#endif
}

inline float BF16ToF32(bf16_bits h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline bf16_bits F32ToBF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<bf16_bits>((u >> 16) | 64);  // quiet NaN
  return static_cast<bf16_bits>((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

}  // namespace mer
