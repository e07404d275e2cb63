#include "common/quant/q3_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::NearestInt;

constexpr int kQK = kKBlockSize;
constexpr int kSub = 16;  // elements per sub-block

// q in [-4, 3] of element e of a block.
inline int Q3Value(const BlockQ3_K& x, int e) {
  const int h = e / 128, s = (e % 128) / 32, l = e % 32;
  const int low = (x.qs[32 * h + l] >> (2 * s)) & 3;
  return (x.hmask[l] >> (4 * h + s)) & 1 ? low : low - 4;
}

void QuantizeBlock(const float* x, BlockQ3_K* y) {
  uint8_t L[kQK];  // q + 4
  float scales[kQK / kSub];
  for (int j = 0; j < kQK / kSub; ++j) scales[j] = quant_internal::FitSignedScale(x + kSub * j, kSub, 4, L + kSub * j);
  const float max_scale = quant_internal::LargestMagnitude(scales, kQK / kSub);
  std::memset(y, 0, sizeof(*y));
  int codes[kQK / kSub];
  if (std::fabs(max_scale) < 1e-15f) {
    std::fill(codes, codes + kQK / kSub, 32);  // scale 0 under d = 0
    std::fill(L, L + kQK, 4);
  } else {
    // The largest sub-block scale maps to -32, the extra negative 6-bit level.
    const float iscale = -32.0f / max_scale;
    y->d = F32ToF16(1.0f / iscale);
    for (int j = 0; j < kQK / kSub; ++j) codes[j] = 32 + std::clamp(NearestInt(iscale * scales[j]), -32, 31);
    // Requantize against the scales as they will be decoded.
    const float d = F16ToF32(y->d);
    for (int j = 0; j < kQK / kSub; ++j) {
      const float dj = d * (codes[j] - 32);
      for (int i = 0; i < kSub; ++i) {
        L[kSub * j + i] =
            dj == 0.0f ? 4 : static_cast<uint8_t>(4 + std::clamp(NearestInt(x[kSub * j + i] / dj), -4, 3));
      }
    }
  }
  for (int j = 0; j < kQK / kSub; ++j) {
    y->scales[j % 8] |= static_cast<uint8_t>((codes[j] & 0xF) << (j < 8 ? 0 : 4));
    y->scales[8 + j % 4] |= static_cast<uint8_t>((codes[j] >> 4) << (2 * (j / 4)));
  }
  for (int e = 0; e < kQK; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    y->qs[32 * h + l] |= static_cast<uint8_t>((L[e] & 3) << (2 * s));
    y->hmask[l] |= static_cast<uint8_t>((L[e] >> 2) << (4 * h + s));
  }
}

}  // namespace

void QuantizeRowQ3_K(const float* src, BlockQ3_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void DequantizeRowQ3_K(const BlockQ3_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ3_K& x = src[b];
    const float d = F16ToF32(x.d);
    for (int j = 0; j < kQK / kSub; ++j) {
      const float dj = d * (Q3_KScale(x.scales, j) - 32);
      for (int i = kSub * j; i < kSub * (j + 1); ++i) dst[b * kQK + i] = dj * Q3Value(x, i);
    }
  }
}

void VecDotRowsQ3_K(const BlockQ3_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q3_k(rows, n_rows, a, n, out);
}

void VecDotRowsQ3_KScalar(const BlockQ3_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ3_K& x = rows[r * nb + b];
      const BlockQ8_K& y = a[b];
      int32_t sumi = 0;
      for (int j = 0; j < kQK / kSub; ++j) {
        int32_t s = 0;
        for (int i = kSub * j; i < kSub * (j + 1); ++i) s += Q3Value(x, i) * y.qs[i];
        sumi += (Q3_KScale(x.scales, j) - 32) * s;
      }
      sum += F16ToF32(x.d) * y.d * static_cast<float>(sumi);
    }
    out[r] = sum;
  }
}

}  // namespace mer
