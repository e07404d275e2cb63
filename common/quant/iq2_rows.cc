// IQ2_XXS, IQ2_XS and IQ2_S x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h); the
// avx512 variant differs only in vpdpwssd for the scale multiply-adds and IQ2_S's masked sign
// flips. iq2.h states the order.
#include "common/quant/iq2.h"
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// R weight rows against one activation row; per row one 8-lane f32 accumulator, updated
// identically for every R.
template <int R>
void IQ2_XXSRowsKernel(const BlockIQ2_XXS* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockIQ2_XXS), b * sizeof(BlockIQ2_XXS), 2);
    const BlockQ8_K& ab = a[b];
    ForEachRow<R>([&](auto r) {
      const BlockIQ2_XXS& wb = w[r * nb + b];
      // Grid codes <= 43 and |a| <= 127: maddubs's int16 pair sums stay below 2^14.
      __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int j = 0; j < 8; ++j) {
        const uint32_t a0 = LoadU32(wb.qs + 4 * j), a1 = LoadU32(wb.qs + 4 * j + 2);
        const __m256i grid = _mm256_setr_epi64x(
            static_cast<int64_t>(kIQ2_XXSGrid[a0 & 0xFF]), static_cast<int64_t>(kIQ2_XXSGrid[(a0 >> 8) & 0xFF]),
            static_cast<int64_t>(kIQ2_XXSGrid[(a0 >> 16) & 0xFF]), static_cast<int64_t>(kIQ2_XXSGrid[a0 >> 24]));
        const __m256i signs = _mm256_setr_epi64x(static_cast<int64_t>(kIQSignBytes.bytes[a1 & 127]),
                                                 static_cast<int64_t>(kIQSignBytes.bytes[(a1 >> 7) & 127]),
                                                 static_cast<int64_t>(kIQSignBytes.bytes[(a1 >> 14) & 127]),
                                                 static_cast<int64_t>(kIQSignBytes.bytes[(a1 >> 21) & 127]));
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * j));
        const __m256i pairs = _mm256_maddubs_epi16(grid, _mm256_sign_epi8(av, signs));
        sums[j % 2] = DotI16(sums[j % 2], pairs, _mm256_set1_epi16(static_cast<int16_t>(2 * (a1 >> 28) + 1)));
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * ab.d),
                               _mm256_cvtepi32_ps(_mm256_add_epi32(sums[0], sums[1])), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = 0.125f * HorizontalSum(acc[r]);
}

// The 16 scales 2 ls + 1 of an IQ2_XS or IQ2_S block (4-bit codes, two a byte) as int16 in element
// order (sub-block j's first 16 elements, then its last 16), the first 8 sub-blocks' in both
// 128-bit lanes of out[0], the last 8's in out[1]: a sub-block's two are then picked by
// kRunScaleShuffles.
inline void HalfSubBlockScales(const uint8_t* scales, __m256i out[2]) {
  const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales));
  const __m128i codes = _mm_unpacklo_epi8(_mm_and_si128(packed, _mm_set1_epi8(0xF)),
                                          _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0xF)));
  const __m256i all_scales = _mm256_cvtepu8_epi16(_mm_add_epi8(_mm_add_epi8(codes, codes), _mm_set1_epi8(1)));
  out[0] = _mm256_permute2x128_si256(all_scales, all_scales, 0x00);
  out[1] = _mm256_permute2x128_si256(all_scales, all_scales, 0x11);
}

// The same for IQ2_XS and IQ2_S, a scale per 16 elements: Products(wb, j, av) is the int16 pair
// sums of sub-block j's grid bytes with its activations av under its signs, the one step where
// the formats differ.
template <int R, typename Block, __m256i (*Products)(const Block&, int, __m256i)>
void HalfScaleRowsKernel(const Block* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(Block), b * sizeof(Block), 3);
    const BlockQ8_K& ab = a[b];
    ForEachRow<R>([&](auto r) {
      const Block& wb = w[r * nb + b];
      __m256i half_scales[2];
      HalfSubBlockScales(wb.scales, half_scales);
      __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      // Unrolled, so that the accumulators stay in registers (GCC keeps this loop otherwise).
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * j));
        const __m256i pairs = Products(wb, j, av);
        const __m256i scales = _mm256_shuffle_epi8(
            half_scales[j / 4], _mm256_load_si256(reinterpret_cast<const __m256i*>(kRunScaleShuffles.bytes[j % 4])));
        sums[j % 2] = DotI16(sums[j % 2], pairs, scales);
      }
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * ab.d),
                               _mm256_cvtepi32_ps(_mm256_add_epi32(sums[0], sums[1])), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = 0.125f * HorizontalSum(acc[r]);
}

// IQ2_XS: a 9-bit grid index and 7 sign bits per group.
inline __m256i IQ2_XSGroupProducts(const BlockIQ2_XS& wb, int j, __m256i av) {
  const uint16_t* q = wb.qs + 4 * j;
  const __m256i grid =
      _mm256_setr_epi64x(static_cast<int64_t>(kIQ2_XSGrid[q[0] & 511]), static_cast<int64_t>(kIQ2_XSGrid[q[1] & 511]),
                         static_cast<int64_t>(kIQ2_XSGrid[q[2] & 511]), static_cast<int64_t>(kIQ2_XSGrid[q[3] & 511]));
  const __m256i signs = _mm256_setr_epi64x(
      static_cast<int64_t>(kIQSignBytes.bytes[q[0] >> 9]), static_cast<int64_t>(kIQSignBytes.bytes[q[1] >> 9]),
      static_cast<int64_t>(kIQSignBytes.bytes[q[2] >> 9]), static_cast<int64_t>(kIQSignBytes.bytes[q[3] >> 9]));
  return _mm256_maddubs_epi16(grid, _mm256_sign_epi8(av, signs));
}

// IQ2_S: a 10-bit grid index and 8 sign bits per group.
inline __m256i IQ2_SGroupProducts(const BlockIQ2_S& wb, int j, __m256i av) {
  const uint8_t* q = wb.qs + 4 * j;
  const int qh = wb.qh[j];
  const __m256i grid = _mm256_setr_epi64x(static_cast<int64_t>(kIQ2_SGrid[q[0] | ((qh << 8) & 0x300)]),
                                          static_cast<int64_t>(kIQ2_SGrid[q[1] | ((qh << 6) & 0x300)]),
                                          static_cast<int64_t>(kIQ2_SGrid[q[2] | ((qh << 4) & 0x300)]),
                                          static_cast<int64_t>(kIQ2_SGrid[q[3] | ((qh << 2) & 0x300)]));
  return _mm256_maddubs_epi16(grid, NegateWhereBitsSet(av, LoadU32(wb.qs + kKBlockSize / 8 + 4 * j)));
}

}  // namespace

void IQ2_XSRows(const BlockIQ2_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(n_rows, [&](auto group, int64_t r) {
    HalfScaleRowsKernel<group, BlockIQ2_XS, IQ2_XSGroupProducts>(rows + r * nb, nb, a, out + r);
  });
}

void IQ2_SRows(const BlockIQ2_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(n_rows, [&](auto group, int64_t r) {
    HalfScaleRowsKernel<group, BlockIQ2_S, IQ2_SGroupProducts>(rows + r * nb, nb, a, out + r);
  });
}

void IQ2_XXSRows(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(n_rows, [&](auto group, int64_t r) { IQ2_XXSRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
