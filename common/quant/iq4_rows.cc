// IQ4_NL and IQ4_XS row kernels, compiled once per SIMD variant (row_kernels.h); the avx512
// variant differs only in vpdpbusd / vpdpwssd for the integer products. iq4.h states the f32
// orders; IQ4_NL's kernel is table4_rows.h's.
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"
#include "common/quant/table4_rows.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// The codebook in both 128-bit lanes, for pshufb.
inline __m256i CodebookTable() {
  return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values)));
}

// R IQ4_XS rows against one Q8_K activation row; per row one 8-lane f32 accumulator, updated
// identically for every R.
template <int R>
void IQ4_XSRowsKernel(const BlockIQ4_XS* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i table = CodebookTable();
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockIQ4_XS), b * sizeof(BlockIQ4_XS), 3);
    const BlockQ8_K& ab = a[b];
    ForEachRow<R>([&](auto r) {
      const BlockIQ4_XS& wb = w[r * nb + b];
      // |value| <= 127 and |a| <= 127: maddubs's int16 pair sums stay below 32768.
      __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int j = 0; j < 8; ++j) {
        const __m256i q = _mm256_shuffle_epi8(table, Nibbles(wb.qs + 16 * j));
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * j));
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(av, q));
        sums[j % 2] = DotI16(sums[j % 2], pairs, _mm256_set1_epi16(static_cast<int16_t>(IQ4_XSScale(wb, j) - 32)));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * ab.d),
                               _mm256_cvtepi32_ps(_mm256_add_epi32(sums[0], sums[1])), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

}  // namespace

void IQ4_NLRows(const BlockIQ4_NL* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  const __m256i table = CodebookTable();
  ForRowGroups<8>(n_rows,
                  [&](auto group, int64_t r) { Table4RowsKernel<group>(rows + r * nb, nb, a, table, out + r); });
}

void IQ4_XSRows(const BlockIQ4_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(n_rows, [&](auto group, int64_t r) { IQ4_XSRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
