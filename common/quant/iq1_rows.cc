// IQ1_S x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h); the avx512 variant
// differs only in vpdpwssd for the scale multiply-adds. iq1.h states the order.
#include <cmath>

#include "common/quant/iq1.h"
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// R weight rows against one activation row; per row an 8-lane f32 accumulator and a scalar one
// for the offsets, updated identically for every R.
template <int R>
void IQ1_SRowsKernel(const BlockIQ1_S* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  float acc_offsets[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    acc_offsets[r] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockIQ1_S), b * sizeof(BlockIQ1_S), 2);
    const BlockQ8_K& ab = a[b];
    ForEachRow<R>([&](auto r) {
      const BlockIQ1_S& wb = w[r * nb + b];
      // Grid values in [-1, 1] and |a| <= 127: maddubs's int16 pair sums stay below 2^8.
      __m256i sums = _mm256_setzero_si256();
      int32_t sum_offsets = 0;
      // Unrolled, so that the accumulators stay in registers (GCC keeps this loop otherwise).
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const uint8_t* q = wb.qs + 4 * j;
        const int qh = wb.qh[j];
        const __m256i grid = _mm256_setr_epi64x(static_cast<int64_t>(kIQ1_SGrid[q[0] | ((qh << 8) & 0x700)]),
                                                static_cast<int64_t>(kIQ1_SGrid[q[1] | ((qh << 5) & 0x700)]),
                                                static_cast<int64_t>(kIQ1_SGrid[q[2] | ((qh << 2) & 0x700)]),
                                                static_cast<int64_t>(kIQ1_SGrid[q[3] | ((qh >> 1) & 0x700)]));
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs + 32 * j));
        // |v| * (a with v's sign): the products v * a, with an unsigned first operand.
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(grid, grid), _mm256_sign_epi8(av, grid));
        const int ls = 2 * ((qh >> 12) & 7) + 1;
        sums = DotI16(sums, pairs, _mm256_set1_epi16(static_cast<int16_t>(ls)));
        sum_offsets += (qh & 0x8000 ? -ls : ls) * (ab.bsums[2 * j] + ab.bsums[2 * j + 1]);
      }
      const float d = ab.d * F16ToF32(wb.d);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sums), acc[r]);
      acc_offsets[r] = std::fma(d, static_cast<float>(sum_offsets), acc_offsets[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]) + kIQ1_SDelta * acc_offsets[r];
}

}  // namespace

void IQ1_SRows(const BlockIQ1_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<2>(n_rows, [&](auto group, int64_t r) { IQ1_SRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
