#include "common/quant/float_dot.h"

#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer {
namespace {

// Element -> f32 for the scalar paths.
struct F16Tag {};
struct BF16Tag {};

template <typename Tag>
inline float ElemToF32(uint16_t v);
template <>
inline float ElemToF32<F16Tag>(uint16_t v) {
  return F16ToF32(v);
}
template <>
inline float ElemToF32<BF16Tag>(uint16_t v) {
  return BF16ToF32(v);
}

template <typename Tag>
void HalfRowsScalar(const uint16_t* rows, int64_t n_rows, const uint16_t* a, int64_t n, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const uint16_t* w = rows + r * n;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += ElemToF32<Tag>(w[i]) * ElemToF32<Tag>(a[i]);
    out[r] = static_cast<float>(sum);
  }
}

}  // namespace

void ConvertF32ToF16(const float* src, f16_bits* dst, int64_t n) {
  int64_t i = 0;
  // vcvtps2ph with immediate 0 = round to nearest even, the same rounding as F32ToF16.
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
  }
  for (; i < n; ++i) dst[i] = F32ToF16(src[i]);
}

void ConvertF16ToF32(const f16_bits* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
  for (; i < n; ++i) dst[i] = F16ToF32(src[i]);
}

void ConvertF32ToBF16(const float* src, bf16_bits* dst, int64_t n) {
  int64_t i = 0;
  // The same integer rounding as F32ToBF16, 8 lanes at a time.
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  const __m256i inf_bits = _mm256_set1_epi32(0x7f800000);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i quiet = _mm256_set1_epi32(64);
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf_bits);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet);
    const __m256i h = _mm256_blendv_epi8(rounded, nan, is_nan);
    // Lanes hold values <= 0xffff, so the unsigned-saturating pack is exact; it interleaves the
    // 128-bit halves, which the 64-bit permute undoes.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_castsi256_si128(packed));
  }
  for (; i < n; ++i) dst[i] = F32ToBF16(src[i]);
}

void ConvertBF16ToF32(const bf16_bits* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(src[i]);
}

void VecDotRowsF32(const float* rows, int64_t n_rows, const float* a, int64_t n, float* out) {
  quant_internal::ActiveRowKernels().f32(rows, n_rows, a, n, out);
}

void VecDotRowsF16(const f16_bits* rows, int64_t n_rows, const f16_bits* a, int64_t n, float* out) {
  quant_internal::ActiveRowKernels().f16(rows, n_rows, a, n, out);
}

void VecDotRowsBF16(const bf16_bits* rows, int64_t n_rows, const bf16_bits* a, int64_t n, float* out) {
  quant_internal::ActiveRowKernels().bf16(rows, n_rows, a, n, out);
}

void VecDotRowsF32Scalar(const float* rows, int64_t n_rows, const float* a, int64_t n, float* out) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* w = rows + r * n;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += w[i] * a[i];  // f32 product, double sum
    out[r] = static_cast<float>(sum);
  }
}

void VecDotRowsF16Scalar(const f16_bits* rows, int64_t n_rows, const f16_bits* a, int64_t n, float* out) {
  HalfRowsScalar<F16Tag>(rows, n_rows, a, n, out);
}

void VecDotRowsBF16Scalar(const bf16_bits* rows, int64_t n_rows, const bf16_bits* a, int64_t n, float* out) {
  HalfRowsScalar<BF16Tag>(rows, n_rows, a, n, out);
}

}  // namespace mer
