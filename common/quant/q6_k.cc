#include "common/quant/q6_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::FitSignedScale;
using quant_internal::NearestInt;

constexpr int kQK = kKBlockSize;
constexpr int kSub = 16;   // elements per sub-block
constexpr int kNmax = 32;  // q - 32 in [-32, 31]

// 6-bit code (q in [0, 63]) of element e of a block.
inline int Q6Code(const BlockQ6_K& x, int e) {
  const int half = e / 128, group = (e % 128) / 32, l = e % 32;
  const uint8_t ql = x.ql[64 * half + l + 32 * (group & 1)];
  const uint8_t low = group < 2 ? (ql & 0xF) : (ql >> 4);
  const uint8_t high = (x.qh[32 * half + l] >> (2 * group)) & 3;
  return low | (high << 4);
}

void QuantizeBlock(const float* x, BlockQ6_K* y) {
  uint8_t L[kQK];
  float scales[kQK / kSub];
  for (int j = 0; j < kQK / kSub; ++j) scales[j] = FitSignedScale(x + kSub * j, kSub, kNmax, L + kSub * j);
  const float max_scale = quant_internal::LargestMagnitude(scales, kQK / kSub);
  std::memset(y, 0, sizeof(*y));
  if (std::fabs(max_scale) < 1e-15f) return;  // all zero: d = 0 decodes everything to 0
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
                     : static_cast<uint8_t>(kNmax + std::clamp(NearestInt(x[kSub * j + i] / dj), -kNmax, kNmax - 1));
    }
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* Lh = L + 128 * half;
    for (int l = 0; l < 32; ++l) {
      y->ql[64 * half + l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
      y->ql[64 * half + l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
      y->qh[32 * half + l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
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

void VecDotRowsQ6_K(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q6_k(rows, n_rows, a, n, out);
}

void VecDotRowsQ6_KAvx2(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::avx2::Q6_KRows(rows, n_rows, a, n, out);
}

void VecDotRowsQ6_KScalar(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
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
