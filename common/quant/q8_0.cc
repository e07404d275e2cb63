#include "common/quant/q8_0.h"

#include <algorithm>
#include <cmath>

#include "common/base/check.h"
#include "common/quant/simd_internal.h"

namespace mer {
namespace {

constexpr int kQK = kQ8_0BlockSize;

// Round half to even under the default rounding mode, as _mm256_round_ps(x, nearest) does.
inline int8_t SaturateToInt8(float v) {
  const float r = std::nearbyint(v);
  return static_cast<int8_t>(std::clamp(r, -128.0f, 127.0f));
}

#if defined(MER_QUANT_AVX2)

// R weight rows against one activation row. Per row a single f32 accumulator, updated in the
// same order for every R, so out[r] does not depend on how rows are grouped.
template <bool kVnni, int R>
void Q8_0RowsKernel(const BlockQ8_0* w, int64_t nb, const BlockQ8_0* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // Weights stream from DRAM once per token: ask for each row's data ~1 KiB ahead, so the
    // R row streams do not all wait on the hardware prefetcher's ramp at every row start.
    for (int r = 0; r < R; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(&w[r * nb + b]) + 1024, _MM_HINT_T0);
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = F16ToF32(a[b].d);
    if constexpr (kVnni) {
      // dot(w, a) = dot(w + 128, a) - 128 * sum(a): w ^ 0x80 is w + 128 as an unsigned byte, which
      // vpdpbusd needs, and the correction depends on the activation only, so it is paid once for R
      // rows. Starting each row's sum from -128 * sum(a) (per lane) makes the result exact.
      const __m256i neg_bias = _mm256_sub_epi32(
          _mm256_setzero_si256(),
          quant_internal::DotU8S8<true>(_mm256_setzero_si256(), _mm256_set1_epi8(char(0x80)), qa));
      quant_internal::ForEachRow<R>([&](auto r) {
        const BlockQ8_0& wb = w[r * nb + b];
        const __m256i qw =
            _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs)),
                             _mm256_set1_epi8(char(0x80)));
        const __m256i sum = quant_internal::DotU8S8<true>(neg_bias, qw, qa);
        acc[r] =
            _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * da), _mm256_cvtepi32_ps(sum), acc[r]);
      });
    } else {
      // Without VNNI: |w| * (a with w's sign), whose int16 pair sums cannot saturate since
      // |w|, |a| <= 128, 127.
      quant_internal::ForEachRow<R>([&](auto r) {
        const BlockQ8_0& wb = w[r * nb + b];
        const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs));
        const __m256i sum = quant_internal::DotU8S8<false>(
            _mm256_setzero_si256(), _mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qa, qw));
        acc[r] =
            _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * da), _mm256_cvtepi32_ps(sum), acc[r]);
      });
    }
  }
  for (int r = 0; r < R; ++r) out[r] = quant_internal::HorizontalSum(acc[r]);
}

template <bool kVnni>
void Q8_0Rows(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  const int64_t nb = n / kQK;
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) Q8_0RowsKernel<kVnni, 4>(rows + r * nb, nb, a, out + r);
  for (; r < n_rows; ++r) Q8_0RowsKernel<kVnni, 1>(rows + r * nb, nb, a, out + r);
}

#endif  // MER_QUANT_AVX2

}  // namespace

void QuantizeRowQ8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQK;
#if defined(MER_QUANT_AVX2)
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 vmax =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
#else
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
#endif
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    dst[b].d = F32ToF16(d);
#if defined(MER_QUANT_AVX2)
    const __m256 mul = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      q[k] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    // Saturating packs interleave 128-bit halves; the permute restores element order.
    const __m256i packed =
        _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    const __m256i ordered =
        _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst[b].qs), ordered);
#else
    for (int j = 0; j < kQK; ++j) dst[b].qs[j] = SaturateToInt8(x[j] * id);
#endif
  }
}

void QuantizeRowQ8_0Reference(const float* src, BlockQ8_0* dst, int64_t n) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[b].d = F32ToF16(d);
    for (int j = 0; j < kQK; ++j) dst[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void DequantizeRowQ8_0(const BlockQ8_0* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t b = 0; b < nb; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = d * src[b].qs[j];
  }
}

void VecDotRowsQ8_0(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n,
                    float* out) {
  CHECK(n % kQK == 0);
#if defined(MER_QUANT_AVX2)
  Q8_0Rows<quant_internal::kHaveVnni>(rows, n_rows, a, n, out);
#else
  VecDotRowsQ8_0Scalar(rows, n_rows, a, n, out);
#endif
}

void VecDotRowsQ8_0Avx2(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n,
                        float* out) {
  CHECK(n % kQK == 0);
#if defined(MER_QUANT_AVX2)
  Q8_0Rows<false>(rows, n_rows, a, n, out);
#else
  VecDotRowsQ8_0Scalar(rows, n_rows, a, n, out);
#endif
}

void VecDotRowsQ8_0Scalar(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n,
                          float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    const BlockQ8_0* w = rows + r * nb;
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int32_t isum = 0;
      for (int j = 0; j < kQK; ++j) isum += int32_t{w[b].qs[j]} * a[b].qs[j];
      sum += static_cast<float>(isum) * (F16ToF32(w[b].d) * F16ToF32(a[b].d));
    }
    out[r] = sum;
  }
}

}  // namespace mer
