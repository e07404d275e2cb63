// Q5_K x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h); the avx512 variant
// differs only in vpdpwssd for the scale multiply-adds.
//
// Per row and block, as ggml's AVX2 code: 8 int32 lanes, lane k the sum over the block's 8
// sub-blocks j of sc[j] times the products of bytes 4k .. 4k + 3 of j's 32 elements (exact),
// converted to f32 and added to the row's 8-lane accumulator by one fused multiply-add with
// d_w * d_a; the mins term as one int32 per block, added to a scalar f32 by a fused multiply-add
// with -(d_a * dmin_w). The row's result is the accumulator's horizontal sum plus that scalar.
#include <cmath>

#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// pshufb mask: byte j of the decoded scales -> dword j holding sc[j] in both int16 halves
// (sc[0..3] from the low 128 bits, sc[4..7] from the high).
inline __m256i ScalePairsMask() {
  return _mm256_setr_epi8(0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3, -128, 3, -128, 4,
                          -128, 4, -128, 5, -128, 5, -128, 6, -128, 6, -128, 7, -128, 7, -128);
}

// Bit 4 of every byte of x taken from bit `bit` (0..7) of the same byte, the other bits zero.
inline __m256i BitToBit4(__m256i x, int bit) {
  // A 16-bit shift by at most 4 brings bit 4 of each byte from within the same byte.
  if (bit <= 4) return _mm256_and_si256(_mm256_slli_epi16(x, 4 - bit), _mm256_set1_epi8(0x10));
  return _mm256_and_si256(_mm256_srli_epi16(x, bit - 4), _mm256_set1_epi8(0x10));
}

// The block's 8 int32 lanes of scaled sums. q <= 31 and |a| <= 127 keep maddubs's int16 pair
// sums below 2^13, and each lane below 2^24, so its f32 conversion is exact.
inline __m256i ScaledSums(const BlockQ5_K& wb, __m128i sm, const int8_t* aq, __m256i mask) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  alignas(32) int32_t scale_pairs[8];
  int32_t* const pairs = Opaque(scale_pairs);
  _mm256_store_si256(reinterpret_cast<__m256i*>(scale_pairs),
                     _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sm), mask));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qh));
  __m256i chunk_sums[4];
  for (int c = 0; c < 4; ++c) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs + 32 * c));
    const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, low4), BitToBit4(qh, 2 * c));
    const __m256i hi =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4), BitToBit4(qh, 2 * c + 1));
    const __m256i p_lo =
        _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 64 * c)));
    const __m256i p_hi = _mm256_maddubs_epi16(
        hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 64 * c + 32)));
    chunk_sums[c] = DotI16(_mm256_madd_epi16(p_lo, _mm256_set1_epi32(pairs[2 * c])), p_hi,
                           _mm256_set1_epi32(pairs[2 * c + 1]));
  }
  return _mm256_add_epi32(_mm256_add_epi32(chunk_sums[0], chunk_sums[1]),
                          _mm256_add_epi32(chunk_sums[2], chunk_sums[3]));
}

// R weight rows against one activation row; per row one 8-lane f32 accumulator and one scalar,
// updated identically for every R.
template <int R>
void Q5_KRowsKernel(const BlockQ5_K* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  float acc_m[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    acc_m[r] = 0.0f;
  }
  const __m256i mask = ScalePairsMask();
  // pshufb mask: m[0..7] of the decoded scales -> int16 lanes.
  const __m128i to_mins =
      _mm_setr_epi8(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128);
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockQ5_K), b * sizeof(BlockQ5_K), 4);
    const BlockQ8_K& ab = a[b];
    // Sums of the activation quants over each 32-element sub-block, for the dmin term.
    const __m128i bsum_pairs =
        _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ab.bsums)),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(ab.bsums + 8)));
    ForEachRow<R>([&](auto r) {
      const BlockQ5_K& wb = w[r * nb + b];
      const __m128i sm = DecodeQ4_KScalesMins(wb.scales);
      __m128i prod_m = _mm_madd_epi16(_mm_shuffle_epi8(sm, to_mins), bsum_pairs);
      prod_m = _mm_add_epi32(prod_m, _mm_unpackhi_epi64(prod_m, prod_m));
      prod_m = _mm_add_epi32(prod_m, _mm_shuffle_epi32(prod_m, _MM_SHUFFLE(1, 1, 1, 1)));
      const float dmin = -(ab.d * F16ToF32(wb.dmin));
      acc_m[r] = std::fma(dmin, static_cast<float>(_mm_cvtsi128_si32(prod_m)), acc_m[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ab.d * F16ToF32(wb.d)),
                               _mm256_cvtepi32_ps(ScaledSums(wb, sm, ab.qs, mask)), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]) + acc_m[r];
}

}  // namespace

void Q5_KRows(const BlockQ5_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(
      n_rows, [&](auto group, int64_t r) { Q5_KRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
