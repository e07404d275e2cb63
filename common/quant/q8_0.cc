#include "common/quant/q8_0.h"

#include <algorithm>
#include <cmath>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer {
namespace {

constexpr int kQK = kQ8_0BlockSize;

// One block of ggml's AVX2 activation quantizer: *d = amax / 127 (in f32), qs = x * (127 / amax)
// rounded half to even; returns the sum of the quants.
int32_t QuantizeActivationBlock(const float* x, float* d, int8_t* qs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
  __m256 vmax = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  *d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const __m256 mul = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  __m256i sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i sum4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  sum4 = _mm_add_epi32(sum4, _mm_unpackhi_epi64(sum4, sum4));
  sum4 = _mm_add_epi32(sum4, _mm_shuffle_epi32(sum4, _MM_SHUFFLE(1, 1, 1, 1)));
  // Saturating packs interleave 128-bit halves; the permute restores element order.
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i ordered = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), ordered);
  return _mm_cvtsi128_si32(sum4);
}

}  // namespace

void QuantizeRowQ8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    float d;
    QuantizeActivationBlock(src + b * kQK, &d, dst[b].qs);
    dst[b].d = F32ToF16(d);
  }
}

void QuantizeRowQ8_1(const float* src, BlockQ8_1* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    float d;
    const int32_t sum = QuantizeActivationBlock(src + b * kQK, &d, dst[b].qs);
    dst[b].d = F32ToF16(d);
    dst[b].s = F32ToF16(d * static_cast<float>(sum));
  }
}

void DequantizeRowQ8_1(const BlockQ8_1* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = d * src[b].qs[j];
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

void VecDotRowsQ8_0(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q8_0(rows, n_rows, a, n, out);
}

void VecDotRowsQ8_0Scalar(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
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
