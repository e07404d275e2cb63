// Block layouts of the quantized GGUF/ggml formats mer reads and computes on, byte for byte as
// they lie in a GGUF file (little-endian, no padding), so a tensor's bytes can be used in place
// as an array of these structs. Plain C++ so a CUDA backend can include it as is.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/tensor/half.h"

namespace mer {

inline constexpr int kQ8_0BlockSize = 32;   // QK8_0
inline constexpr int kKBlockSize = 256;     // QK_K: super-block size of the K-quants
inline constexpr int kQ4_KScaleBytes = 12;  // 8 six-bit scales + 8 six-bit mins

// Q8_0: x[i] = d * qs[i].
struct BlockQ8_0 {
  f16_bits d;
  int8_t qs[kQ8_0BlockSize];
};

// The 32-element formats: element i < 16 is the low nibble of qs[i], element 16 + i the high one.
inline int Nibble32(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4; }

// Q4_0: x = d * (q - 8), q in [0, 15].
struct BlockQ4_0 {
  f16_bits d;
  uint8_t qs[kQ8_0BlockSize / 2];
};

// Q4_1: x = d * q + m, q in [0, 15].
struct BlockQ4_1 {
  f16_bits d;
  f16_bits m;
  uint8_t qs[kQ8_0BlockSize / 2];
};

// Q5_0: x = d * (q - 16), q in [0, 31]; bit 4 of element i is bit i of qh (little-endian u32).
struct BlockQ5_0 {
  f16_bits d;
  uint8_t qh[4];
  uint8_t qs[kQ8_0BlockSize / 2];
};

// Q5_1: x = d * q + m, q in [0, 31]; bit 4 of element i is bit i of qh (little-endian u32).
struct BlockQ5_1 {
  f16_bits d;
  f16_bits m;
  uint8_t qh[4];
  uint8_t qs[kQ8_0BlockSize / 2];
};

// Q8_1: the activation format of Q4_1 and Q5_1 dot products (never stored in files).
// x[i] = d * qs[i]; s = d * sum(qs) in f16, so the m term of a dot product needs no pass over
// the quants.
struct BlockQ8_1 {
  f16_bits d;
  f16_bits s;
  int8_t qs[kQ8_0BlockSize];
};

// The IQ4 codebook: a 4-bit code q stands for kIQ4Values[q] (non-uniform, denser near zero).
inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_NL: Q4_0's layout; x = d * kIQ4Values[q].
struct BlockIQ4_NL {
  f16_bits d;
  uint8_t qs[kQ8_0BlockSize / 2];
};

// IQ4_XS: 8 sub-blocks of 32; x = d * (ls[j] - 32) * kIQ4Values[q], ls[j] six bits: the low
// (j even) or high (j odd) nibble of scales_l[j / 2], and bits 2j, 2j + 1 of scales_h as bits 4,
// 5. Sub-block j's codes are qs[16j .. 16j + 15] as in IQ4_NL (low nibbles first).
struct BlockIQ4_XS {
  f16_bits d;
  uint16_t scales_h;
  uint8_t scales_l[kKBlockSize / 64];
  uint8_t qs[kKBlockSize / 2];
};

// The signs of a group of 8 elements of the grid IQ types, from its 7-bit sign index s: bit i
// set where element i is negative; bits 0-6 are s, bit 7 their parity (an even number of
// negatives).
inline uint8_t IQSignBits(int s) {
  return static_cast<uint8_t>(s | ((__builtin_popcount(static_cast<unsigned>(s)) & 1) << 7));
}

// IQ2_XXS: 8 sub-blocks of 32, each of 4 groups of 8 elements on a grid of 256 points
// (kIQ2_XXSGrid, iq2.h). Sub-block j's 8 bytes at qs[4j] are two little-endian u32: a0 holds
// the grid index of group l in byte l; a1 holds group l's 7 sign bits at bits 7l .. 7l + 6 (the
// 8th sign is their parity: IQSignBits) and the scale code ls in bits 28-31.
// x = d * (0.5 + ls) / 4 * grid byte * sign, the grid bytes being 8, 25 or 43.
struct BlockIQ2_XXS {
  f16_bits d;
  uint16_t qs[kKBlockSize / 8];
};

// IQ2_XS: 8 sub-blocks of 32, each of 4 groups of 8 elements on a grid of 512 points
// (kIQ2_XSGrid, iq2.h). qs[4j + l] is sub-block j's group l: bits 0-8 its grid index, bits 9-15
// its sign index (IQSignBits). scales[j] holds the scale codes of groups 0, 1 (low nibble) and
// 2, 3 (high nibble). x = d * (0.5 + ls) / 4 * grid byte * sign.
struct BlockIQ2_XS {
  f16_bits d;
  uint16_t qs[kKBlockSize / 8];
  uint8_t scales[kKBlockSize / 32];
};

// IQ3_XXS: 8 sub-blocks of 32, each of 4 groups of 8 elements, each group two points of a grid
// of 256 points of 4 elements (kIQ3_XXSGrid, iq3.h). qs[8j + 2l] and qs[8j + 2l + 1] are the grid
// indices of sub-block j's group l (its elements 0-3 and 4-7); the little-endian u32 at
// qs[64 + 4j] holds group l's 7 sign bits at bits 7l .. 7l + 6 (IQSignBits) and the scale code ls
// in bits 28-31. x = d * (0.5 + ls) / 2 * grid byte * sign.
struct BlockIQ3_XXS {
  f16_bits d;
  uint8_t qs[3 * kKBlockSize / 8];
};

// IQ3_S: 8 sub-blocks of 32, each of 4 groups of 8 elements, each group two points of a grid of
// 512 points of 4 elements (kIQ3_SGrid, iq3.h) and 8 free signs. Group l of sub-block j has the
// grid indices qs[8j + 2l] | (bit 2l of qh[j]) << 8 (its elements 0-3) and
// qs[8j + 2l + 1] | (bit 2l + 1 of qh[j]) << 8 (elements 4-7), and bit i of signs[4j + l] set
// where element i is negative. Sub-block j's scale code ls is the low (j even) or high (j odd)
// nibble of scales[j / 2]. x = d * (1 + 2 ls) * grid byte * sign, the grid bytes odd, 1 to 15.
struct BlockIQ3_S {
  f16_bits d;
  uint8_t qs[kKBlockSize / 4];
  uint8_t qh[kKBlockSize / 32];
  uint8_t signs[kKBlockSize / 8];
  uint8_t scales[kKBlockSize / 64];
};

// IQ2_S: 8 sub-blocks of 32, each of 4 groups of 8 elements on a grid of 1024 points (kIQ2_SGrid,
// iq2.h, coded as IQ2_XXS's) and 8 free signs. Group g = 4j + l (sub-block j) has the grid index
// qs[g] | (bits 2l, 2l + 1 of qh[j]) << 8, and bit i of qs[32 + g] set where element i is
// negative. scales[j] holds the scale codes of groups 0, 1 (low nibble) and 2, 3 (high nibble).
// x = d * (0.5 + ls) / 4 * grid byte * sign.
struct BlockIQ2_S {
  f16_bits d;
  uint8_t qs[kKBlockSize / 4];  // 32 bytes of grid indices, then 32 of signs
  uint8_t qh[kKBlockSize / 32];
  uint8_t scales[kKBlockSize / 32];
};

// IQ1_S: 8 sub-blocks of 32, each of 4 groups of 8 elements on a grid of 2048 points whose bytes
// are the signed values -1, 0, 1 (kIQ1_SGrid, iq1.h). Group g = 4j + l (sub-block j) has the grid
// index qs[g] | (bits 3l .. 3l + 2 of qh[j]) << 8; bits 12-14 of qh[j] are j's scale code ls and
// bit 15 the sign of its offset. x = d * (2 ls + 1) * (grid value + delta), delta =
// -kIQ1_SDelta where bit 15 is set, else +kIQ1_SDelta.
inline constexpr float kIQ1_SDelta = 0.125f;  // IQ1S_DELTA
struct BlockIQ1_S {
  f16_bits d;
  uint8_t qs[kKBlockSize / 8];
  uint16_t qh[kKBlockSize / 32];
};

// Q4_K: 8 sub-blocks of 32; x = d * sc[j] * q - dmin * m[j], q in [0, 15].
// scales[12] packs sc[j] and m[j] (6 bits each): for j < 4, sc[j] = scales[j] & 63 and
// m[j] = scales[j + 4] & 63; for j >= 4, sc[j] = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4)
// and m[j] = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4).
// qs: 4 chunks of 32 bytes; byte l of chunk c holds element 64c + l in its low nibble and
// element 64c + 32 + l in its high nibble.
struct BlockQ4_K {
  f16_bits d;     // scale of the 6-bit sub-block scales
  f16_bits dmin;  // scale of the 6-bit sub-block mins
  uint8_t scales[kQ4_KScaleBytes];
  uint8_t qs[kKBlockSize / 2];
};

// Q5_K: Q4_K with a fifth bit per quant; x = d * sc[j] * q - dmin * m[j], q in [0, 31].
// scales as Q4_K's; qs as Q4_K's (the low 4 bits); bit 4 of element 64c + l is bit 2c of qh[l],
// of element 64c + 32 + l bit 2c + 1 of qh[l] (l in [0, 32)).
struct BlockQ5_K {
  f16_bits d;     // scale of the 6-bit sub-block scales
  f16_bits dmin;  // scale of the 6-bit sub-block mins
  uint8_t scales[kQ4_KScaleBytes];
  uint8_t qh[kKBlockSize / 8];
  uint8_t qs[kKBlockSize / 2];
};

// Q3_K: 16 sub-blocks of 16; x = d * (sc[j] - 32) * q, q in [-4, 3], sc[j] six bits
// (Q3_KScale). Element 128h + 32s + l (h in [0, 2), s in [0, 4), l in [0, 32)) has its low two
// bits at bits 2s, 2s + 1 of qs[32h + l], and q = those bits - 4 where bit 4h + s of hmask[l] is
// clear (as they are).
struct BlockQ3_K {
  uint8_t hmask[kKBlockSize / 8];
  uint8_t qs[kKBlockSize / 4];
  uint8_t scales[12];
  f16_bits d;
};

// Q2_K: 16 sub-blocks of 16; x = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4), q in [0, 3].
// Element 128h + 32s + l (h in [0, 2), s in [0, 4), l in [0, 32)) is bits 2s, 2s + 1 of
// qs[32h + l]; its sub-block is 8h + 2s + l / 16.
struct BlockQ2_K {
  uint8_t scales[kKBlockSize / 16];
  uint8_t qs[kKBlockSize / 4];
  f16_bits d;
  f16_bits dmin;
};

// Q6_K: 16 sub-blocks of 16; x = d * scales[j] * (q - 32), q in [0, 63].
// Each half of 128 elements uses 64 bytes of ql and 32 of qh; within a half, for l in [0, 32):
//   element l      = ql[l]      & 15 | ((qh[l] >> 0) & 3) << 4
//   element l + 32 = ql[l + 32] & 15 | ((qh[l] >> 2) & 3) << 4
//   element l + 64 = ql[l]      >> 4 | ((qh[l] >> 4) & 3) << 4
//   element l + 96 = ql[l + 32] >> 4 | ((qh[l] >> 6) & 3) << 4
struct BlockQ6_K {
  uint8_t ql[kKBlockSize / 2];
  uint8_t qh[kKBlockSize / 4];
  int8_t scales[kKBlockSize / 16];
  f16_bits d;
};

// Q8_K: the activation format of K-quant dot products (never stored in files).
// x[i] = d * qs[i]; bsums[j] = sum of qs[16j .. 16j + 15], so the dmin term of a K-quant dot
// product needs no pass over the quants.
struct BlockQ8_K {
  float d;
  int8_t qs[kKBlockSize];
  int16_t bsums[kKBlockSize / 16];
};

static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockIQ2_XXS) == 66);
static_assert(sizeof(BlockIQ3_XXS) == 98);
static_assert(sizeof(BlockIQ2_XS) == 74);
static_assert(sizeof(BlockIQ3_S) == 110);
static_assert(sizeof(BlockIQ2_S) == 82);
static_assert(sizeof(BlockIQ1_S) == 50);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(offsetof(BlockQ4_K, qs) == 16);
static_assert(offsetof(BlockQ5_K, qs) == 48);
static_assert(offsetof(BlockQ3_K, d) == 108);
static_assert(offsetof(BlockQ2_K, d) == 80);
static_assert(offsetof(BlockQ6_K, d) == 208);
static_assert(offsetof(BlockQ8_K, bsums) == 260);

// Decodes sub-block j's 6-bit scale and min from a Q4_K scales array (j in [0, 8)).
inline void Q4_KScaleMin(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Sub-block j's 6-bit scale code from a Q3_K scales array (j in [0, 16)); the scale is the code
// minus 32. Its low 4 bits are the low (j < 8) or high (j >= 8) nibble of scales[j % 8], its high
// 2 bits bits 2 (j / 4), 2 (j / 4) + 1 of scales[8 + j % 4].
inline uint8_t Q3_KScale(const uint8_t* scales, int j) {
  const int low = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
  const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return static_cast<uint8_t>(low | (high << 4));
}

// Sub-block j's 6-bit scale code of an IQ4_XS block (j in [0, 8)); the scale is the code minus 32.
inline int IQ4_XSScale(const BlockIQ4_XS& x, int j) {
  return ((x.scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((x.scales_h >> (2 * j)) & 3) << 4);
}

}  // namespace mer
