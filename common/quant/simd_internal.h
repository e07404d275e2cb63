// x86 SIMD helpers shared by the kernels of common/quant (internal, not part of the API).
//
// Every mer binary is built for AVX2 + FMA + F16C (the top-level CMakeLists.txt). The row kernels
// (*_rows.cc) are compiled once more per wider kernel variant, with that variant's target flags
// and MER_QUANT_VARIANT naming the namespace they define everything in
// (common/quant/CMakeLists.txt, row_kernels.h). The helpers below are inline functions in that
// namespace too: were they in one namespace for all variants, the linker would keep one copy of
// each out-of-line instance, which could be the AVX-512 one called from the AVX2 kernels.
// (quant_variant_symbols, a test, checks that the AVX-512 objects define no symbol outside their
// namespace.)
#pragma once

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "common/quant is compiled for AVX2 + FMA + F16C at least"
#endif

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/tensor/half.h"

// The baseline: the format files' own SIMD code (quantizers, conversions) and the avx2 kernels.
#if !defined(MER_QUANT_VARIANT)
#define MER_QUANT_VARIANT avx2
#endif

// The avx512 variant's target: the kernels use VNNI (vpdpbusd, vpdpwssd on 256-bit vectors),
// vpternlog, and 512-bit steps where they measured faster (q4_k_rows.cc).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define MER_QUANT_AVX512 1
#endif

namespace mer::quant_internal::MER_QUANT_VARIANT {

inline uint32_t LoadU32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Returns p such that the compiler no longer knows what it points to: reads through it stay
// loads (broadcast loads, which need no shuffle unit) instead of being forwarded from an earlier
// store of a vector as register shuffles.
template <typename T>
inline T* Opaque(T* p) {
  asm("" : "+r"(p));
  return p;
}

// Calls f(std::integral_constant<int, r>{}) for r = 0 .. R-1. The kernels keep one accumulator
// per row in an array; indexing it with constants (rather than a loop variable) lets the compiler
// keep the accumulators in registers.
template <int R, typename F>
inline void ForEachRow(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) { (f(std::integral_constant<int, I>{}), ...); }
  (std::make_integer_sequence<int, R>{});
}

// Calls kernel(std::integral_constant<int, G>{}, r) for the groups of G rows starting at r = 0,
// G, 2G, ... that fit in n_rows, then kernel(std::integral_constant<int, 1>{}, r) for each row
// left: the kernels are templates on their row count.
template <int G, typename Kernel>
inline void ForRowGroups(int64_t n_rows, Kernel&& kernel) {
  int64_t r = 0;
  for (; r + G <= n_rows; r += G) kernel(std::integral_constant<int, G>{}, r);
  for (; r < n_rows; ++r) kernel(std::integral_constant<int, 1>{}, r);
}

// Weights stream from DRAM once per token: each kernel asks for every row's data kPrefetchBytes
// ahead, so that its R row streams do not all wait on the hardware prefetcher's ramp at every row
// start. Rows of a group are contiguous, and so are the groups: past a row's end the address moves
// on to the same row of the next group, which the kernel reads next, rather than into row r + 1,
// which it is reading already. (Prefetches never fault, past the last row either.)
// `lines` cache lines from `offset` bytes into row r of the group starting at row0, for every r.
inline constexpr int64_t kPrefetchBytes = 1024;
template <int R>
inline void PrefetchRows(const void* row0, int64_t row_bytes, int64_t offset, int lines) {
  int64_t ahead = offset + kPrefetchBytes;
  if (ahead >= row_bytes) ahead += (R - 1) * row_bytes;
  const char* p = static_cast<const char*>(row0) + ahead;
  for (int r = 0; r < R; ++r) {
    for (int line = 0; line < lines; ++line) _mm_prefetch(p + r * row_bytes + 64 * line, _MM_HINT_T0);
  }
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HorizontalSum(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// acc + sum over groups of 4 bytes of u[i] * s[i] (u unsigned, s signed), per int32 lane: one
// vpdpbusd in the avx512 variant. In the avx2 variant this goes through int16 pair sums, which
// saturate: callers guarantee |u[2i] * s[2i] + u[2i+1] * s[2i+1]| <= 32767. Both forms give the
// same exact int32 lanes.
inline __m256i DotU8S8(__m256i acc, __m256i u, __m256i s) {
#if defined(MER_QUANT_AVX512)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

// acc + a[2i] * b[2i] + a[2i+1] * b[2i+1] per int32 lane (int16 inputs): one vpdpwssd in the
// avx512 variant.
inline __m256i DotI16(__m256i acc, __m256i a, __m256i b) {
#if defined(MER_QUANT_AVX512)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// pshufb masks for K-quants with 16-element sub-blocks, over 8 int16 scales present in both
// 128-bit lanes: for the k-th run of 32 elements (k in [0, 4)), int16 2k (the scale of the run's
// first 16 elements) into every int16 of the low lane and 2k + 1 into every int16 of the high
// lane.
struct RunScaleShuffles {
  alignas(32) uint8_t bytes[4][32];
};
constexpr RunScaleShuffles MakeRunScaleShuffles() {
  RunScaleShuffles t{};
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 32; ++i) t.bytes[k][i] = static_cast<uint8_t>(2 * (2 * k + i / 16) + i % 2);
  }
  return t;
}
inline constexpr RunScaleShuffles kRunScaleShuffles = MakeRunScaleShuffles();

// For every sign index s of the grid IQ types (IQSignBits, blocks.h), the 8 signs as bytes for
// vpsignb: -1 where element i is negative, +1 elsewhere.
struct SignBytes {
  uint64_t bytes[128];
};
constexpr SignBytes MakeSignBytes() {
  SignBytes t{};
  for (int s = 0; s < 128; ++s) {
    int parity = 0;
    for (int i = 0; i < 7; ++i) parity ^= (s >> i) & 1;
    const int mask = s | (parity << 7);
    for (int i = 0; i < 8; ++i) t.bytes[s] |= static_cast<uint64_t>((mask >> i) & 1 ? 0xFF : 0x01) << (8 * i);
  }
  return t;
}
inline constexpr SignBytes kIQSignBytes = MakeSignBytes();

// a with byte e negated where bit e of `signs` is set (e in [0, 32)): the 8 free sign bits per
// group of 8 elements of IQ3_S and IQ2_S, four groups' bytes read as one little-endian u32. The
// avx512 variant negates under a byte mask; the avx2 one spreads the bits over the bytes and
// negates as (a ^ m) - m with m = -1 where a bit is set (measured faster than vpsignb with signs
// looked up per byte). Both wrap -128 to itself.
inline __m256i NegateWhereBitsSet(__m256i a, uint32_t signs) {
#if defined(MER_QUANT_AVX512)
  return _mm256_mask_sub_epi8(a, static_cast<__mmask32>(signs), _mm256_setzero_si256(), a);
#else
  const __m256i byte_of =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit_of = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i bits =
      _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(signs)), byte_of), bit_of);
  const __m256i m = _mm256_cmpeq_epi8(bits, bit_of);
  return _mm256_sub_epi8(_mm256_xor_si256(a, m), m);
#endif
}

// The 8 six-bit scales and mins of a Q4_K or Q5_K block as bytes sc[0..7], m[0..7]: the packing
// of blocks.h undone four bytes at a time, in dword lanes u0, u1, u2 of the scales array:
//   sc[0..3] = u0 & 0x3f..   sc[4..7] = (u2 & 0x0f..) | ((u0 >> 2) & 0x30..)
//   m[0..3]  = u1 & 0x3f..   m[4..7]  = ((u2 >> 4) & 0x0f..) | ((u1 >> 2) & 0x30..)
// The 16-byte load reads the 4 bytes after the 12 scale bytes, inside the block in both formats.
inline __m128i DecodeQ4_KScalesMins(const uint8_t* scales) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  const __m128i low_bits =
      _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i high_bits = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                                          _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low_bits, high_bits);
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
