#include "common/quant/q5_k.h"

#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

constexpr int kQK = kKBlockSize;

// 5-bit code (q in [0, 31]) of element e of a block.
inline int Q5Code(const BlockQ5_K& x, int e) {
  const int chunk = e / 64, high_nibble = (e / 32) % 2, l = e % 32;
  const int low = (x.qs[32 * chunk + l] >> (4 * high_nibble)) & 0xF;
  const int bit4 = (x.qh[l] >> (2 * chunk + high_nibble)) & 1;
  return low | (bit4 << 4);
}

void QuantizeBlock(const float* x, BlockQ5_K* y) {
  uint8_t L[kQK];
  quant_internal::QuantizeScaleMinBlock(x, 31, y->scales, &y->d, &y->dmin, L);
  std::memset(y->qh, 0, sizeof(y->qh));
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
      y->qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      y->qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
}

}  // namespace

void QuantizeRowQ5_K(const float* src, BlockQ5_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void DequantizeRowQ5_K(const BlockQ5_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ5_K& x = src[b];
    const float d = F16ToF32(x.d), dmin = F16ToF32(x.dmin);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      Q4_KScaleMin(x.scales, j, &sc, &m);
      const float dj = d * sc, mj = dmin * m;
      for (int i = 32 * j; i < 32 * (j + 1); ++i) dst[b * kQK + i] = dj * Q5Code(x, i) - mj;
    }
  }
}

void VecDotRowsQ5_K(const BlockQ5_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q5_k(rows, n_rows, a, n, out);
}

void VecDotRowsQ5_KScalar(const BlockQ5_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ5_K& x = rows[r * nb + b];
      const BlockQ8_K& y = a[b];
      int32_t sum_q = 0, sum_m = 0;
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        Q4_KScaleMin(x.scales, j, &sc, &m);
        int32_t s = 0;
        for (int i = 32 * j; i < 32 * (j + 1); ++i) s += Q5Code(x, i) * y.qs[i];
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
