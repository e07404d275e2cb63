// Q8_0 x Q8_0 row kernels, compiled once per SIMD variant (row_kernels.h). The avx512 variant
// takes the same 256-bit steps, with vpdpbusd: two blocks per 512-bit step (the two fused
// multiply-adds of a row still one after the other, as the f32 order requires) measured 25% slower
// on Zen 4 (vec_dot_bench 2048 256: 15.3 against 12.2 us), the inserts and extracts costing more
// than the halved integer steps save.
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

#if defined(MER_QUANT_AVX512)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// R weight rows against one activation row. Per row a single f32 accumulator, updated in the
// same order for every R, so out[r] does not depend on how rows are grouped.
template <int R>
void Q8_0RowsKernel(const BlockQ8_0* w, int64_t nb, const BlockQ8_0* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    PrefetchRows<R>(w, nb * sizeof(BlockQ8_0), b * sizeof(BlockQ8_0), 1);
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = F16ToF32(a[b].d);
    if constexpr (kVnni) {
      // dot(w, a) = dot(w + 128, a) - 128 * sum(a): w ^ 0x80 is w + 128 as an unsigned byte, which
      // vpdpbusd needs, and the correction depends on the activation only, so it is paid once for R
      // rows. Starting each row's sum from -128 * sum(a) (per lane) makes the result exact.
      const __m256i neg_bias =
          _mm256_sub_epi32(_mm256_setzero_si256(), DotU8S8(_mm256_setzero_si256(), _mm256_set1_epi8(char(0x80)), qa));
      ForEachRow<R>([&](auto r) {
        const BlockQ8_0& wb = w[r * nb + b];
        const __m256i qw =
            _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs)), _mm256_set1_epi8(char(0x80)));
        const __m256i sum = DotU8S8(neg_bias, qw, qa);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * da), _mm256_cvtepi32_ps(sum), acc[r]);
      });
    } else {
      // Without VNNI: |w| * (a with w's sign), whose int16 pair sums cannot saturate since
      // |w|, |a| <= 128, 127.
      ForEachRow<R>([&](auto r) {
        const BlockQ8_0& wb = w[r * nb + b];
        const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs));
        const __m256i sum = DotU8S8(_mm256_setzero_si256(), _mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * da), _mm256_cvtepi32_ps(sum), acc[r]);
      });
    }
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

}  // namespace

void Q8_0Rows(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  ForRowGroups<4>(n_rows, [&](auto group, int64_t r) { Q8_0RowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
