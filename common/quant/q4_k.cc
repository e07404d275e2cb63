#include "common/quant/q4_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"

namespace mer {
namespace {

constexpr int kQK = kKBlockSize;
constexpr int kSub = 32;  // elements per sub-block

inline int NearestInt(float v) {
  const float biased = v + 12582912.0f;  // 1.5 * 2^23: rounds half to even into the low bits
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// Fits x[i] ~ scale * L[i] - min over one sub-block, L[i] in [0, nmax], min >= 0, minimising the
// weighted squared error: a start from the (lo, hi) range, then 21 trial inverse scales around
// nmax / (hi - lo), each followed by the closed-form least-squares scale and offset for its L.
// Returns scale; *min_out = min. (The make_qkx2_quants search of ggml.)
float FitScaleMin(const float* x, const float* w, int nmax, uint8_t* L, float* min_out) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < kSub; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;  // a positive offset would have to be stored as a negative min
  if (hi == lo) {
    std::fill(L, L + kSub, 0);
    *min_out = -lo;
    return 0.0f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1.0f / iscale;
  float best_err = 0.0f;
  for (int i = 0; i < kSub; ++i) {
    const int l = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
    L[i] = static_cast<uint8_t>(l);
    const float diff = scale * l + lo - x[i];
    best_err += w[i] * diff * diff;
  }
  uint8_t trial[kSub];
  for (int step = 0; step <= 20; ++step) {
    iscale = (-1.0f + 0.1f * step + nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < kSub; ++i) {
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
    for (int i = 0; i < kSub; ++i) {
      const float diff = this_scale * trial[i] + this_lo - x[i];
      err += w[i] * diff * diff;
    }
    if (err < best_err) {
      std::memcpy(L, trial, kSub);
      best_err = err;
      scale = this_scale;
      lo = this_lo;
    }
  }
  *min_out = -lo;
  return scale;
}

void QuantizeBlock(const float* x, BlockQ4_K* y) {
  float scales[8], mins[8];
  uint8_t L[kQK];
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + kSub * j;
    float sum_x2 = 0;
    for (int i = 0; i < kSub; ++i) sum_x2 += xs[i] * xs[i];
    // Weight large-magnitude elements more, as ggml does without an importance matrix.
    const float av_x = std::sqrt(sum_x2 / kSub);
    float weights[kSub];
    for (int i = 0; i < kSub; ++i) weights[i] = av_x + std::fabs(xs[i]);
    scales[j] = FitScaleMin(xs, weights, 15, L + kSub * j, &mins[j]);
  }
  const float max_scale = *std::max_element(scales, scales + 8);
  const float max_min = *std::max_element(mins, mins + 8);
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(y->scales, 0, sizeof(y->scales));
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, NearestInt(inv_scale * scales[j]));
    const int lm = std::min(63, NearestInt(inv_min * mins[j]));
    if (j < 4) {
      y->scales[j] = static_cast<uint8_t>(ls);
      y->scales[j + 4] = static_cast<uint8_t>(lm);
    } else {
      y->scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      y->scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      y->scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  y->d = F32ToF16(max_scale / 63.0f);
  y->dmin = F32ToF16(max_min / 63.0f);
  // Requantize against the scales as they will be decoded (6-bit, times f16 d and dmin).
  const float d = F16ToF32(y->d), dmin = F16ToF32(y->dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    Q4_KScaleMin(y->scales, j, &sc, &m);
    const float dj = d * sc;
    const float mj = dmin * m;
    for (int i = 0; i < kSub; ++i) {
      L[kSub * j + i] =
          dj == 0.0f
              ? 0
              : static_cast<uint8_t>(std::clamp(NearestInt((x[kSub * j + i] + mj) / dj), 0, 15));
    }
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      y->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
  }
}

}  // namespace

void QuantizeRowQ4_K(const float* src, BlockQ4_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void DequantizeRowQ4_K(const BlockQ4_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ4_K& x = src[b];
    const float d = F16ToF32(x.d), dmin = F16ToF32(x.dmin);
    float* y = dst + b * kQK;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc_lo, m_lo, sc_hi, m_hi;
      Q4_KScaleMin(x.scales, 2 * c, &sc_lo, &m_lo);
      Q4_KScaleMin(x.scales, 2 * c + 1, &sc_hi, &m_hi);
      const float d_lo = d * sc_lo, min_lo = dmin * m_lo;
      const float d_hi = d * sc_hi, min_hi = dmin * m_hi;
      for (int l = 0; l < 32; ++l) {
        y[64 * c + l] = d_lo * (x.qs[32 * c + l] & 0xF) - min_lo;
        y[64 * c + 32 + l] = d_hi * (x.qs[32 * c + l] >> 4) - min_hi;
      }
    }
  }
}

void VecDotRowsQ4_K(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                    float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q4_k(rows, n_rows, a, n, out);
}

void VecDotRowsQ4_KAvx2(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                        float* out) {
  CHECK(n % kQK == 0);
  quant_internal::avx2::Q4_KRows(rows, n_rows, a, n, out);
}

void VecDotRowsQ4_KScalar(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                          float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ4_K& x = rows[r * nb + b];
      const BlockQ8_K& y = a[b];
      int32_t sum_q = 0, sum_m = 0;
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        Q4_KScaleMin(x.scales, j, &sc, &m);
        const int chunk = j / 2, shift = 4 * (j % 2);
        int32_t s = 0;
        for (int l = 0; l < 32; ++l)
          s += ((x.qs[32 * chunk + l] >> shift) & 0xF) * y.qs[32 * j + l];
        sum_q += sc * s;
        sum_m += m * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
      }
      sum += F16ToF32(x.d) * y.d * static_cast<float>(sum_q);
      sum -= F16ToF32(x.dmin) * y.d * static_cast<float>(sum_m);
    }
    out[r] = sum;
  }
}

}  // namespace mer
