// Q2_K x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h); the avx512 variant
// differs only in vpdpwssd for the scale multiply-adds.
//
// Per row and block, as ggml's AVX2 code: the mins term as 8 int32 lanes (lane k:
// m[2k] * bsums[2k] + m[2k + 1] * bsums[2k + 1]), converted to f32 and added to the row's 8-lane
// accumulator by a fused multiply-add with -(d_a * dmin_w); then 8 int32 lanes of scaled sums,
// lane k the sum over the block's 8 runs of 32 elements of sc[j] times the products of bytes
// 4k .. 4k + 3 of the run (j the run's sub-block 2 run + k / 4), added by a second fused
// multiply-add with d_w * d_a.
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// R weight rows against one activation row; per row one 8-lane f32 accumulator, updated
// identically for every R.
template <int R>
void Q2_KRowsKernel(const BlockQ2_K* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  __m256i shuffles[4];
  for (int s = 0; s < 4; ++s)
    shuffles[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(kRunScaleShuffles.bytes[s]));
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockQ2_K), b * sizeof(BlockQ2_K), 3);
    const BlockQ8_K& ab = a[b];
    const int8_t* aq = ab.qs;
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.bsums));
    ForEachRow<R>([&](auto r) {
      const BlockQ2_K& wb = w[r * nb + b];
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.scales));
      const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
      const __m256i prod_m = _mm256_madd_epi16(mins, bsums);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(-(ab.d * F16ToF32(wb.dmin))),
                               _mm256_cvtepi32_ps(prod_m), acc[r]);
      const __m256i scales = _mm256_cvtepu8_epi16(_mm_and_si128(packed, low4));
      // q <= 3 and |a| <= 127: the int16 pair sums of maddubs stay below 2^10.
      __m256i half_sums[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i half_scales = h == 0 ? _mm256_permute2x128_si256(scales, scales, 0x00)
                                           : _mm256_permute2x128_si256(scales, scales, 0x11);
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs + 32 * h));
        __m256i sum = _mm256_setzero_si256();
        for (int s = 0; s < 4; ++s) {
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * s), low2);
          const __m256i p = _mm256_maddubs_epi16(
              q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 128 * h + 32 * s)));
          sum = DotI16(sum, p, _mm256_shuffle_epi8(half_scales, shuffles[s]));
        }
        half_sums[h] = sum;
      }
      acc[r] =
          _mm256_fmadd_ps(_mm256_set1_ps(ab.d * F16ToF32(wb.d)),
                          _mm256_cvtepi32_ps(_mm256_add_epi32(half_sums[0], half_sums[1])), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

}  // namespace

void Q2_KRows(const BlockQ2_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(
      n_rows, [&](auto group, int64_t r) { Q2_KRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
