#include "common/quant/scale_fit.h"

#include <algorithm>
#include <cmath>

#include "common/base/check.h"
#include "common/quant/blocks.h"

namespace mer::quant_internal {

float FitScaleMin(const float* x, const float* w, int n, int nmax, uint8_t* L, float* min_out) {
  CHECK(n >= 1 && n <= 32);
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;  // a positive offset would have to be stored as a negative min
  if (hi == lo) {
    std::fill(L, L + n, 0);
    *min_out = -lo;
    return 0.0f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1.0f / iscale;
  float best_err = 0.0f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
    L[i] = static_cast<uint8_t>(l);
    const float diff = scale * l + lo - x[i];
    best_err += w[i] * diff * diff;
  }
  uint8_t trial[32];
  for (int step = 0; step <= 20; ++step) {
    iscale = (-1.0f + 0.1f * step + nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_lo = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_lo > 0) {
      this_lo = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * trial[i] + this_lo - x[i];
      err += w[i] * diff * diff;
    }
    if (err < best_err) {
      std::memcpy(L, trial, n);
      best_err = err;
      scale = this_scale;
      lo = this_lo;
    }
  }
  *min_out = -lo;
  return scale;
}

float FitSignedScale(const float* x, int n, int nmax, uint8_t* L) {
  const float max = LargestMagnitude(x, n);
  if (std::fabs(max) < 1e-15f) {
    std::fill(L, L + n, nmax);
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  auto assign = [&](float iscale) {
    for (int i = 0; i < n; ++i) {
      L[i] = static_cast<uint8_t>(nmax + std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1));
    }
  };
  float sumlx, suml2;
  float iscale = -nmax / max;
  fit(iscale, &sumlx, &suml2);
  assign(iscale);
  float scale = suml2 > 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;  // the error reduction of the least-squares scale
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(nmax + 0.1f * step) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      assign(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

float FitRmsWeightedScaleMin(const float* x, int n, int nmax, uint8_t* L, float* min_out) {
  CHECK(n >= 1 && n <= 32);
  float sum_x2 = 0;
  for (int i = 0; i < n; ++i) sum_x2 += x[i] * x[i];
  const float av_x = std::sqrt(sum_x2 / n);
  float weights[32];
  for (int i = 0; i < n; ++i) weights[i] = av_x + std::fabs(x[i]);
  return FitScaleMin(x, weights, n, nmax, L, min_out);
}

void QuantizeScaleMinBlock(const float* x, int nmax, uint8_t* packed, f16_bits* d_out, f16_bits* dmin_out, uint8_t* L) {
  constexpr int kSub = 32;
  float scales[8], mins[8];
  for (int j = 0; j < 8; ++j) scales[j] = FitRmsWeightedScaleMin(x + kSub * j, kSub, nmax, L + kSub * j, &mins[j]);
  const float max_scale = *std::max_element(scales, scales + 8);
  const float max_min = *std::max_element(mins, mins + 8);
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(packed, 0, kQ4_KScaleBytes);
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, NearestInt(inv_scale * scales[j]));
    const int lm = std::min(63, NearestInt(inv_min * mins[j]));
    if (j < 4) {
      packed[j] = static_cast<uint8_t>(ls);
      packed[j + 4] = static_cast<uint8_t>(lm);
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d_out = F32ToF16(max_scale / 63.0f);
  *dmin_out = F32ToF16(max_min / 63.0f);
  // Requantize against the scales as they will be decoded (6-bit, times f16 d and dmin).
  const float d = F16ToF32(*d_out), dmin = F16ToF32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    Q4_KScaleMin(packed, j, &sc, &m);
    const float dj = d * sc;
    const float mj = dmin * m;
    for (int i = 0; i < kSub; ++i) {
      L[kSub * j + i] =
          dj == 0.0f ? 0 : static_cast<uint8_t>(std::clamp(NearestInt((x[kSub * j + i] + mj) / dj), 0, nmax));
    }
  }
}

}  // namespace mer::quant_internal
