#include "common/quant/q8_k.h"

#include <cstring>

#include "common/base/check.h"
#include "common/quant/simd_internal.h"

namespace mer {
namespace {

constexpr int kQK = kKBlockSize;

// Index of the first element of largest magnitude (ties keep the first, as ggml's strict '>').
inline int FirstAbsMaxIndex(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  for (int j = 0; j < kQK; j += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float amax = _mm_cvtss_f32(m4);
  if (amax == 0.0f) return -1;
  const __m256 target = _mm256_set1_ps(amax);
  for (int j = 0; j < kQK; j += 8) {
    const int mask =
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), target, _CMP_EQ_OQ));
    if (mask != 0) return j + __builtin_ctz(static_cast<unsigned>(mask));
  }
  return -1;  // only reachable with NaNs, which ggml does not handle either
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
    const __m256 mul = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    for (int j = 0; j < kQK; j += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k) {
        // _mm256_cvtps_epi32 rounds half to even under the default MXCSR, like ggml's
        // nearest_int (which adds 1.5 * 2^23).
        q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), mul)), cap);
      }
      const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y.qs + j),
                          _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
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
