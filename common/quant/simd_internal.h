// x86 SIMD helpers shared by the kernels of common/quant (internal, not part of the API).
// MER_QUANT_AVX2 is set when the AVX2 + FMA + F16C paths are compiled; MER_QUANT_VNNI when the
// 256-bit VNNI dot instructions exist (AVX512-VNNI with VL, or AVX-VNNI), which fuse the
// multiply-adds that plain AVX2 does in two steps. The kernels are templates on kVnni so that a
// VNNI build still has the plain AVX2 variant (for tests); results are identical either way, since
// every integer sum these helpers form is exact.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define MER_QUANT_AVX2 1
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define MER_QUANT_VNNI 1
#define MER_QUANT_ISA "avx512vnni"
#elif defined(__AVXVNNI__)
#define MER_QUANT_VNNI 1
#define MER_QUANT_ISA "avxvnni"
#else
#define MER_QUANT_ISA "avx2"
#endif
#else
#define MER_QUANT_ISA "scalar"
#endif

#include <cstdint>
#include <cstring>
#include <utility>

namespace mer::quant_internal {

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

#if defined(MER_QUANT_AVX2)

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

#if defined(MER_QUANT_VNNI)
inline constexpr bool kHaveVnni = true;
#else
inline constexpr bool kHaveVnni = false;
#endif

// acc + sum over groups of 4 bytes of u[i] * s[i] (u unsigned, s signed), per int32 lane.
// The plain AVX2 form (kVnni false) goes through int16 pair sums, which saturate: callers
// guarantee |u[2i] * s[2i] + u[2i+1] * s[2i+1]| <= 32767.
template <bool kVnni>
inline __m256i DotU8S8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (kVnni) return _mm256_dpbusd_epi32(acc, u, s);
#elif defined(__AVXVNNI__)
  if constexpr (kVnni) return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// acc + a[2i] * b[2i] + a[2i+1] * b[2i+1] per int32 lane (int16 inputs).
template <bool kVnni>
inline __m256i DotI16(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (kVnni) return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  if constexpr (kVnni) return _mm256_dpwssd_avx_epi32(acc, a, b);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
}

#endif  // MER_QUANT_AVX2

}  // namespace mer::quant_internal
