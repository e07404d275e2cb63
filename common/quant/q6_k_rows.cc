// Q6_K x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h). The avx512 variant
// takes the same 256-bit steps, with vpternlog and vpdpwssd: a 512-bit form (both 32-element
// groups of a pair in one step) measured 9% slower on Zen 4 (vec_dot_bench 2048 256: 12.8 against
// 11.7 us).
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// R weight rows against one activation row; per row one f32 accumulator, updated identically
// for every R.
template <int R>
void Q6_KRowsKernel(const BlockQ6_K* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i shuffles[4];
  for (int k = 0; k < 4; ++k)
    shuffles[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(kRunScaleShuffles.bytes[k]));
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockQ6_K), b * sizeof(BlockQ6_K), 4);
    const BlockQ8_K& ab = a[b];
    const int8_t* aq = ab.qs;
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.bsums));
    ForEachRow<R>([&](auto r) {
      const BlockQ6_K& wb = w[r * nb + b];
      const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.scales)));
      // The -32 offset of every code, taken out through the activation sums of each sub-block:
      // sum (q - 32) * a * sc = sum q * a * sc - 32 * sum sc * bsum.
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(scales, bsums), 5);
      // Four short dependency chains (two 32-element groups each), summed at the end: a single
      // chain through 8 multiply-accumulates would be latency-bound.
      __m256i group_sums[4];
      for (int half = 0; half < 2; ++half) {
        const __m256i half_scales = half == 0 ? _mm256_permute2x128_si256(scales, scales, 0x00)
                                              : _mm256_permute2x128_si256(scales, scales, 0x11);
        const uint8_t* ql = wb.ql + 64 * half;
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qh + 32 * half));
        const __m256i q_lo1 = _mm256_srli_epi16(ql0, 4);
        const __m256i q_lo3 = _mm256_srli_epi16(ql1, 4);
        __m256i q[4];
#if defined(MER_QUANT_AVX512)
        // Each code is (low nibble source & 0x0F) | (qh bits moved to bits 4, 5), one bitwise
        // select (vpternlog, A where the 0x0F mask is set, else B) each. The qh operands are
        // pre-masked to bits {0,1,4,5} or {2,3,6,7} so that after their 16-bit shifts bits 6, 7 of
        // every byte are zero; whatever the shifts move into bits 0..3 is not selected.
        const __m256i qh_a = _mm256_and_si256(qh, _mm256_set1_epi8(0x33));
        const __m256i qh_b = _mm256_and_si256(qh, _mm256_set1_epi8(char(0xCC)));
        constexpr int kSelect = 0xE4;  // (C & A) | (~C & B) for operands (A, B, C)
        q[0] = _mm256_ternarylogic_epi32(ql0, _mm256_slli_epi16(qh_a, 4), low4, kSelect);
        q[1] = _mm256_ternarylogic_epi32(ql1, _mm256_slli_epi16(qh_b, 2), low4, kSelect);
        q[2] = _mm256_ternarylogic_epi32(q_lo1, qh_a, low4, kSelect);
        q[3] = _mm256_ternarylogic_epi32(q_lo3, _mm256_srli_epi16(qh_b, 2), low4, kSelect);
#else
        const __m256i bits45 = _mm256_set1_epi8(0x30);
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
        q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
        q[2] = _mm256_or_si256(_mm256_and_si256(q_lo1, low4), _mm256_and_si256(qh, bits45));
        q[3] = _mm256_or_si256(_mm256_and_si256(q_lo3, low4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
#endif
        // q <= 63, |a| <= 127: the int16 pair sums of maddubs stay below 2^14.
        __m256i p[4];
        for (int k = 0; k < 4; ++k) {
          p[k] = _mm256_maddubs_epi16(q[k],
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 128 * half + 32 * k)));
        }
        for (int k = 0; k < 4; k += 2) {
          group_sums[2 * half + k / 2] = DotI16(_mm256_madd_epi16(p[k], _mm256_shuffle_epi8(half_scales, shuffles[k])),
                                                p[k + 1], _mm256_shuffle_epi8(half_scales, shuffles[k + 1]));
        }
      }
      const __m256i sumi = _mm256_sub_epi32(_mm256_add_epi32(_mm256_add_epi32(group_sums[0], group_sums[1]),
                                                             _mm256_add_epi32(group_sums[2], group_sums[3])),
                                            offset);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * ab.d), _mm256_cvtepi32_ps(sumi), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

}  // namespace

void Q6_KRows(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<4>(n_rows, [&](auto group, int64_t r) { Q6_KRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
