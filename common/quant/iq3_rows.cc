// IQ3_XXS and IQ3_S x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h); the avx512
// variant differs only in vpdpwssd for the scale multiply-adds and IQ3_S's masked sign flips.
// iq3.h states the order.
#include "common/quant/iq3.h"
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// R weight rows against one activation row; per row one 8-lane f32 accumulator, updated
// identically for every R.
template <int R>
void IQ3_XXSRowsKernel(const BlockIQ3_XXS* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockIQ3_XXS), b * sizeof(BlockIQ3_XXS), 3);
    const BlockQ8_K& ab = a[b];
    ForEachRow<R>([&](auto r) {
      const BlockIQ3_XXS& wb = w[r * nb + b];
      // Grid codes <= 62 and |a| <= 127: maddubs's int16 pair sums stay below 2^14.
      __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int j = 0; j < 8; ++j) {
        const uint8_t* q = wb.qs + 8 * j;
        const __m256i grid =
            _mm256_i32gather_epi32(reinterpret_cast<const int*>(kIQ3_XXSGrid),
                                   _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))), 4);
        const uint32_t word = LoadU32(wb.qs + 64 + 4 * j);
        const __m256i signs = _mm256_setr_epi64x(static_cast<int64_t>(kIQSignBytes.bytes[word & 127]),
                                                 static_cast<int64_t>(kIQSignBytes.bytes[(word >> 7) & 127]),
                                                 static_cast<int64_t>(kIQSignBytes.bytes[(word >> 14) & 127]),
                                                 static_cast<int64_t>(kIQSignBytes.bytes[(word >> 21) & 127]));
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * j));
        const __m256i pairs = _mm256_maddubs_epi16(grid, _mm256_sign_epi8(av, signs));
        sums[j % 2] = DotI16(sums[j % 2], pairs, _mm256_set1_epi16(static_cast<int16_t>(2 * (word >> 28) + 1)));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * ab.d),
                               _mm256_cvtepi32_ps(_mm256_add_epi32(sums[0], sums[1])), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = 0.25f * HorizontalSum(acc[r]);
}

// The same for IQ3_S: 9-bit grid indices, 8 sign bits per group, scales 2 ls + 1, and no factor
// on the horizontal sum.
template <int R>
void IQ3_SRowsKernel(const BlockIQ3_S* w, int64_t nb, const BlockQ8_K* a, float* out) {
  // Lane k of a sub-block's indices takes bit k of its qh byte as bit 8.
  const __m256i high_shift = _mm256_setr_epi32(8, 7, 6, 5, 4, 3, 2, 1);
  const __m256i high_bit = _mm256_set1_epi32(256);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockIQ3_S), b * sizeof(BlockIQ3_S), 3);
    const BlockQ8_K& ab = a[b];
    ForEachRow<R>([&](auto r) {
      const BlockIQ3_S& wb = w[r * nb + b];
      // Grid codes <= 15 and |a| <= 127: maddubs's int16 pair sums stay below 2^12.
      __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int j = 0; j < 8; ++j) {
        const __m256i low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb.qs + 8 * j)));
        const __m256i high = _mm256_and_si256(_mm256_sllv_epi32(_mm256_set1_epi32(wb.qh[j]), high_shift), high_bit);
        const __m256i grid =
            _mm256_i32gather_epi32(reinterpret_cast<const int*>(kIQ3_SGrid), _mm256_or_si256(low, high), 4);
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * j));
        const __m256i pairs = _mm256_maddubs_epi16(grid, NegateWhereBitsSet(av, LoadU32(wb.signs + 4 * j)));
        const int ls = (wb.scales[j / 2] >> (4 * (j % 2))) & 0xF;
        sums[j % 2] = DotI16(sums[j % 2], pairs, _mm256_set1_epi16(static_cast<int16_t>(2 * ls + 1)));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * ab.d),
                               _mm256_cvtepi32_ps(_mm256_add_epi32(sums[0], sums[1])), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

}  // namespace

void IQ3_SRows(const BlockIQ3_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(n_rows, [&](auto group, int64_t r) { IQ3_SRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

void IQ3_XXSRows(const BlockIQ3_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(n_rows, [&](auto group, int64_t r) { IQ3_XXSRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
