#include "common/quant/q8_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/simd_internal.h"

namespace mer {
namespace {

constexpr int kQK = kKBlockSize;

// ggml's nearest_int: adding 1.5 * 2^23 leaves the integer part in the low mantissa bits, rounded
// half to even; valid for |v| <= 2^22.
inline int NearestInt(float v) {
  const float biased = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// Index of the first element of largest magnitude (ties keep the first, as ggml's strict '>').
inline int FirstAbsMaxIndex(const float* x) {
#if defined(MER_QUANT_AVX2)
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int j = 0; j < kQK; j += 8)
    vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  if (amax == 0.0f) return -1;
  const __m256 target = _mm256_set1_ps(amax);
  for (int j = 0; j < kQK; j += 8) {
    const int mask = _mm256_movemask_ps(
        _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), target, _CMP_EQ_OQ));
    if (mask != 0) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
  return -1;  // only reachable with NaNs, which ggml does not handle either
#else
  float amax = 0.0f;
  int index = -1;
  for (int j = 0; j < kQK; ++j) {
    const float ax = std::fabs(x[j]);
    if (ax > amax) {
      amax = ax;
      index = j;
    }
  }
  return index;
#endif
}

}  // namespace

void QuantizeRowQ8_K(const float* src, BlockQ8_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t b = 0; b < nb; ++b) {
    const float* x = src + b * kQK;
    BlockQ8_K& y = dst[b];
    const int max_index = FirstAbsMaxIndex(x);
    if (max_index < 0) {
      std::memset(&y, 0, sizeof(y));
      continue;
    }
    const float iscale = -127.0f / x[max_index];
#if defined(MER_QUANT_AVX2)
    const __m256 mul = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    for (int j = 0; j < kQK; j += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        // _mm256_cvtps_epi32 rounds half to even under the default MXCSR, like NearestInt.
        q[k] = _mm256_min_epi32(
            _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), mul)), cap);
      }
      const __m256i packed =
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(y.qs + j),
          _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
#else
    for (int j = 0; j < kQK; ++j)
      y.qs[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * x[j])));
#endif
    for (int g = 0; g < kQK / 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y.qs[16 * g + j];
      y.bsums[g] = static_cast<int16_t>(sum);
    }
    y.d = 1.0f / iscale;
  }
}

void DequantizeRowQ8_K(const BlockQ8_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t b = 0; b < nb; ++b) {
    for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = src[b].d * src[b].qs[j];
  }
}

}  // namespace mer
