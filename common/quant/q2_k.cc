#include "common/quant/q2_k.h"

#include <algorithm>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::NearestInt;

constexpr int kQK = kKBlockSize;
constexpr int kSub = 16;  // elements per sub-block

// q in [0, 3] of element e of a block.
inline int Q2Value(const BlockQ2_K& x, int e) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32;
  return (x.qs[32 * h + l] >> (2 * s)) & 3;
}

void QuantizeBlock(const float* x, BlockQ2_K* y) {
  uint8_t L[kQK];
  float scales[kQK / kSub], mins[kQK / kSub];
  for (int j = 0; j < kQK / kSub; ++j) {
    scales[j] = quant_internal::FitRmsWeightedScaleMin(x + kSub * j, kSub, 3, L + kSub * j, &mins[j]);
  }
  const float max_scale = *std::max_element(scales, scales + kQK / kSub);
  const float max_min = *std::max_element(mins, mins + kQK / kSub);
  const float inv_scale = max_scale > 0 ? 15.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 15.0f / max_min : 0.0f;
  for (int j = 0; j < kQK / kSub; ++j) {
    const int ls = std::min(15, NearestInt(inv_scale * scales[j]));
    const int lm = std::min(15, NearestInt(inv_min * mins[j]));
    y->scales[j] = static_cast<uint8_t>(ls | (lm << 4));
  }
  y->d = F32ToF16(max_scale / 15.0f);
  y->dmin = F32ToF16(max_min / 15.0f);
  // Requantize against the scales as they will be decoded (4-bit, times f16 d and dmin).
  const float d = F16ToF32(y->d), dmin = F16ToF32(y->dmin);
  for (int j = 0; j < kQK / kSub; ++j) {
    const float dj = d * (y->scales[j] & 0xF);
    const float mj = dmin * (y->scales[j] >> 4);
    for (int i = 0; i < kSub; ++i) {
      L[kSub * j + i] =
          dj == 0.0f ? 0 : static_cast<uint8_t>(std::clamp(NearestInt((x[kSub * j + i] + mj) / dj), 0, 3));
    }
  }
  std::memset(y->qs, 0, sizeof(y->qs));
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    y->qs[32 * h + l] |= static_cast<uint8_t>(L[e] << (2 * s));
  }
}

}  // namespace

void QuantizeRowQ2_K(const float* src, BlockQ2_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void DequantizeRowQ2_K(const BlockQ2_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ2_K& x = src[b];
    const float d = F16ToF32(x.d), dmin = F16ToF32(x.dmin);
    for (int j = 0; j < kQK / kSub; ++j) {
      const float dj = d * (x.scales[j] & 0xF), mj = dmin * (x.scales[j] >> 4);
      for (int i = kSub * j; i < kSub * (j + 1); ++i) dst[b * kQK + i] = dj * Q2Value(x, i) - mj;
    }
  }
}

void VecDotRowsQ2_K(const BlockQ2_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q2_k(rows, n_rows, a, n, out);
}

void VecDotRowsQ2_KScalar(const BlockQ2_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ2_K& x = rows[r * nb + b];
      const BlockQ8_K& y = a[b];
      int32_t sum_q = 0, sum_m = 0;
      for (int j = 0; j < kQK / kSub; ++j) {
        int32_t s = 0;
        for (int i = kSub * j; i < kSub * (j + 1); ++i) s += Q2Value(x, i) * y.qs[i];
        sum_q += (x.scales[j] & 0xF) * s;
        sum_m += (x.scales[j] >> 4) * y.bsums[j];
      }
      sum += F16ToF32(x.d) * y.d * static_cast<float>(sum_q);
      sum -= F16ToF32(x.dmin) * y.d * static_cast<float>(sum_m);
    }
    out[r] = sum;
  }
}

}  // namespace mer
