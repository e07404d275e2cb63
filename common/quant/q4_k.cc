#include "common/quant/q4_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::QuantizeScaleMinBlock;

constexpr int kQK = kKBlockSize;

void QuantizeBlock(const float* x, BlockQ4_K* y) {
  uint8_t L[kQK];
  QuantizeScaleMinBlock(x, 15, y->scales, &y->d, &y->dmin, L);
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

void VecDotRowsQ4_K(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q4_k(rows, n_rows, a, n, out);
}

void VecDotRowsQ4_KAvx2(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::avx2::Q4_KRows(rows, n_rows, a, n, out);
}

void VecDotRowsQ4_KScalar(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
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
        for (int l = 0; l < 32; ++l) s += ((x.qs[32 * chunk + l] >> shift) & 0xF) * y.qs[32 * j + l];
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
