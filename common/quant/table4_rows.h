// The row kernel of the 32-element formats of one f16 scale and 4-bit codes mapped through a
// table (Q4_0, IQ4_NL), in the order of the 8-row gemv ggml runs on them after repacking (internal
// to common/quant; included by the *_rows.cc files, in their variant's namespace).
#pragma once

#include <cmath>

#include "common/quant/blocks.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {

// The 32 codes of a block as bytes in element order: low nibbles of qs[0..15], then high ones.
inline __m256i Nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Signed weights w times activations a, 4 products per int32 lane: |w| * (a with w's sign).
inline __m256i SignedDot(__m256i w, __m256i a) {
  return DotU8S8(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

// The 8 int32 lanes of v summed, each v[r] of 8 lanes for row r: lane r of the result.
inline __m256i SumLanes8(const __m256i* v) {
  const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  // u0 = (sums of rows 0-3 over the low 128 bits | over the high 128 bits), u1 the same for 4-7.
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

inline int32_t SumLanes(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 1, 1, 1))));
}

// R rows of W (f16 d, then qs[16] of 4-bit codes) against one Q8_0 activation row, each code
// mapped through `table` (16 int8 values, in both 128-bit lanes), in the order of ggml's 8-row
// gemv: per row one f32, acc = fma(block sum, d_w * d_a, acc). R = 8 rows at a time in the lanes
// of one vector; R = 1 for the rows left over, with the same per-row operations.
template <int R, typename W>
void Table4RowsKernel(const W* w, int64_t nb, const BlockQ8_0* a, __m256i table, float* out) {
  static_assert(R == 8 || R == 1);
  __m256 acc8 = _mm256_setzero_ps();
  float acc1 = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    PrefetchRows<R>(w, nb * sizeof(W), b * sizeof(W), 1);
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = F16ToF32(a[b].d);
    __m256i sums[R];
    for (int r = 0; r < R; ++r) sums[r] = SignedDot(_mm256_shuffle_epi8(table, Nibbles(w[r * nb + b].qs)), av);
    if constexpr (R == 8) {
      alignas(16) f16_bits d[8];
      for (int r = 0; r < 8; ++r) d[r] = w[r * nb + b].d;
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d)));
      acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SumLanes8(sums)), _mm256_mul_ps(dw, _mm256_set1_ps(da)), acc8);
    } else {
      acc1 = std::fma(static_cast<float>(SumLanes(sums[0])), F16ToF32(w[b].d) * da, acc1);
    }
  }
  if constexpr (R == 8) {
    _mm256_storeu_ps(out, acc8);
  } else {
    out[0] = acc1;
  }
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
