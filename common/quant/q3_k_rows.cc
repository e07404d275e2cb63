// Q3_K x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h); the avx512 variant
// differs only in vpdpwssd for the scale multiply-adds.
//
// Per row and block, as ggml's AVX2 code: 8 int32 lanes, lane k the sum over the block's 8 runs
// of 32 elements of (sc[j] - 32) times the products of bytes 4k .. 4k + 3 of the run (j the run's
// sub-block 2 run + k / 4), exact, converted to f32 and added to the row's 8-lane accumulator by
// one fused multiply-add with d_w * d_a.
#include <cstring>

#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// The 16 signed scales sc[j] - 32 of a block as int16, sub-block j in element j: the packing of
// blocks.h (Q3_KScale) undone four codes at a time.
inline __m256i DecodeScales(const uint8_t* packed) {
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  const uint32_t low4 = 0x0F0F0F0F, low2 = 0x03030303;
  const __m128i codes =
      _mm_setr_epi32(static_cast<int>((u[0] & low4) | ((u[2] & low2) << 4)),
                     static_cast<int>((u[1] & low4) | (((u[2] >> 2) & low2) << 4)),
                     static_cast<int>(((u[0] >> 4) & low4) | (((u[2] >> 4) & low2) << 4)),
                     static_cast<int>(((u[1] >> 4) & low4) | (((u[2] >> 6) & low2) << 4)));
  return _mm256_cvtepi8_epi16(_mm_sub_epi8(codes, _mm_set1_epi8(32)));
}

// 4 in every byte where bit `bit` of the byte of hmask is clear, else 0: what the high bit takes
// away from the two low bits of a code.
inline __m256i ClearedBitTimes4(__m256i hmask, int bit) {
  const __m256i cleared = _mm256_andnot_si256(hmask, _mm256_set1_epi8(static_cast<char>(1 << bit)));
  // Only bit `bit` of each byte can be set, so a 16-bit shift moves it within its byte.
  return bit >= 2 ? _mm256_srli_epi16(cleared, bit - 2) : _mm256_slli_epi16(cleared, 2 - bit);
}

// R weight rows against one activation row; per row one 8-lane f32 accumulator, updated
// identically for every R.
template <int R>
void Q3_KRowsKernel(const BlockQ3_K* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low2 = _mm256_set1_epi8(0x03);
  __m256i shuffles[4];
  for (int s = 0; s < 4; ++s)
    shuffles[s] = _mm256_load_si256(reinterpret_cast<const __m256i*>(kRunScaleShuffles.bytes[s]));
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockQ3_K), b * sizeof(BlockQ3_K), 3);
    const BlockQ8_K& ab = a[b];
    const int8_t* aq = ab.qs;
    ForEachRow<R>([&](auto r) {
      const BlockQ3_K& wb = w[r * nb + b];
      const __m256i scales = DecodeScales(wb.scales);
      const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.hmask));
      // q = low - high with low <= 3, high in {0, 4}, |a| <= 127: each maddubs's int16 pair sums
      // stay below 2^10, and so does their difference.
      __m256i half_sums[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i half_scales = h == 0 ? _mm256_permute2x128_si256(scales, scales, 0x00)
                                           : _mm256_permute2x128_si256(scales, scales, 0x11);
        const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs + 32 * h));
        __m256i sum = _mm256_setzero_si256();
        for (int s = 0; s < 4; ++s) {
          const __m256i av =
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 128 * h + 32 * s));
          const __m256i low = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * s), low2);
          const __m256i p =
              _mm256_sub_epi16(_mm256_maddubs_epi16(low, av),
                               _mm256_maddubs_epi16(ClearedBitTimes4(hmask, 4 * h + s), av));
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

void Q3_KRows(const BlockQ3_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(
      n_rows, [&](auto group, int64_t r) { Q3_KRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
