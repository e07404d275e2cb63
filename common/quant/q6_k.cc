#include "common/quant/q6_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"

namespace mer {
namespace {

constexpr int kQK = kKBlockSize;
constexpr int kSub = 16;   // elements per sub-block
constexpr int kNmax = 32;  // q - 32 in [-32, 31]

inline int NearestInt(float v) {
  const float biased = v + 12582912.0f;  // 1.5 * 2^23: rounds half to even into the low bits
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// 6-bit code (q in [0, 63]) of element e of a block.
inline int Q6Code(const BlockQ6_K& x, int e) {
  const int half = e / 128, group = (e % 128) / 32, l = e % 32;
  const uint8_t ql = x.ql[64 * half + l + 32 * (group & 1)];
  const uint8_t low = group < 2 ? (ql & 0xF) : (ql >> 4);
  const uint8_t high = (x.qh[32 * half + l] >> (2 * group)) & 3;
  return low | (high << 4);
}

// Fits x[i] ~ scale * (L[i] - 32) with L[i] in [0, 63] over one sub-block, weighting by x^2:
// the largest-magnitude element maps to -32 (the one extra negative level), then 18 trial inverse
// scales around 32 / max, keeping the least-squares scale of the best. Returns the (signed)
// scale. (The make_qx_quants search of ggml, rmse_type 1.)
float FitSignedScale(const float* x, uint8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < kSub; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(L, L + kSub, kNmax);
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < kSub; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -kNmax, kNmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  auto assign = [&](float iscale) {
    for (int i = 0; i < kSub; ++i) {
      L[i] = static_cast<uint8_t>(kNmax + std::clamp(NearestInt(iscale * x[i]), -kNmax, kNmax - 1));
    }
  };
  float sumlx, suml2;
  float iscale = -kNmax / max;
  fit(iscale, &sumlx, &suml2);
  assign(iscale);
  float scale = suml2 > 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;  // the error reduction of the least-squares scale
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(kNmax + 0.1f * step) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      assign(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void QuantizeBlock(const float* x, BlockQ6_K* y) {
  uint8_t L[kQK];
  float scales[kQK / kSub];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < kQK / kSub; ++j) {
    scales[j] = FitSignedScale(x + kSub * j, L + kSub * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  std::memset(y, 0, sizeof(*y));
  if (max_abs_scale < 1e-15f) return;  // all zero: d = 0 decodes everything to 0
  // The largest sub-block scale maps to -128, the extra negative int8 level.
  const float iscale = -128.0f / max_scale;
  y->d = F32ToF16(1.0f / iscale);
  for (int j = 0; j < kQK / kSub; ++j) {
    y->scales[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[j])));
  }
  // Requantize against the scales as they will be decoded.
  const float d = F16ToF32(y->d);
  for (int j = 0; j < kQK / kSub; ++j) {
    const float dj = d * y->scales[j];
    for (int i = 0; i < kSub; ++i) {
      L[kSub * j + i] =
          dj == 0.0f ? kNmax
                     : static_cast<uint8_t>(
                           kNmax + std::clamp(NearestInt(x[kSub * j + i] / dj), -kNmax, kNmax - 1));
    }
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* Lh = L + 128 * half;
    for (int l = 0; l < 32; ++l) {
      y->ql[64 * half + l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
      y->ql[64 * half + l + 32] =
          static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
      y->qh[32 * half + l] =
          static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                               ((Lh[l + 96] >> 4) << 6));
    }
  }
}

}  // namespace

void QuantizeRowQ6_K(const float* src, BlockQ6_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void DequantizeRowQ6_K(const BlockQ6_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ6_K& x = src[b];
    const float d = F16ToF32(x.d);
    for (int e = 0; e < kQK; ++e) dst[b * kQK + e] = d * x.scales[e / kSub] * (Q6Code(x, e) - 32);
  }
}

void VecDotRowsQ6_K(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                    float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q6_k(rows, n_rows, a, n, out);
}

void VecDotRowsQ6_KAvx2(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                        float* out) {
  CHECK(n % kQK == 0);
  quant_internal::avx2::Q6_KRows(rows, n_rows, a, n, out);
}

void VecDotRowsQ6_KScalar(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                          float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ6_K& x = rows[r * nb + b];
      const BlockQ8_K& y = a[b];
      int32_t sumi = 0;
      for (int j = 0; j < kQK / kSub; ++j) {
        int32_t s = 0;
        for (int i = kSub * j; i < kSub * (j + 1); ++i) s += (Q6Code(x, i) - 32) * y.qs[i];
        sumi += x.scales[j] * s;
      }
      sum += F16ToF32(x.d) * y.d * static_cast<float>(sumi);
    }
    out[r] = sum;
  }
}

}  // namespace mer
