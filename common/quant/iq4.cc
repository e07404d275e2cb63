#include "common/quant/iq4.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::NearestInt;

constexpr int kQK = kQ8_0BlockSize;  // elements per IQ4_NL block and per IQ4_XS sub-block

// For each integer k in [-128, 127], the index of the largest codebook value <= k (0 below the
// first): the codebook's values are integers, so the values at or below a float v are those at or
// below floor(v).
constexpr std::array<uint8_t, 256> kIQ4FloorIndex = [] {
  std::array<uint8_t, 256> t{};
  for (int k = -128; k < 128; ++k) {
    int i = 0;
    while (i < 15 && kIQ4Values[i + 1] <= k) ++i;
    t[k + 128] = static_cast<uint8_t>(i);
  }
  return t;
}();

// The index of the codebook value nearest to v (the lower one of a tie; 0 for NaN): the value at
// or below v from kIQ4FloorIndex, then the nearer of it and the next (the quantizer's inner loop,
// ~26 trials per weight, so no binary search here).
int NearestCode(float v) {
  if (!(v > kIQ4Values[0])) return 0;
  if (v >= kIQ4Values[15]) return 15;
  int k = static_cast<int>(v);  // floor(v): v > -127
  if (static_cast<float>(k) > v) --k;
  const int i = kIQ4FloorIndex[k + 128];
  return v - kIQ4Values[i] <= kIQ4Values[i + 1] - v ? i : i + 1;
}

void PackCodes(const uint8_t* codes, uint8_t* qs) {
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>(codes[i] | (codes[i + 16] << 4));
}

// Fits x[i] ~ d * kIQ4Values[codes[i]] over 32 values: trial scales around those mapping the
// element of largest magnitude to -127 and to 113, each followed by the least-squares d for its
// codes; the least squared error wins. Returns d (0 for an all-zero group, codes then 8: value 1).
float FitCodebook(const float* x, uint8_t* codes) {
  const float max = quant_internal::LargestMagnitude(x, kQK);
  if (std::fabs(max) < 1e-15f) {
    std::fill(codes, codes + kQK, 8);
    return 0.0f;
  }
  float best_err = INFINITY, best_d = 0;
  uint8_t trial[kQK];
  for (const float end : {-127.0f, 113.0f}) {
    for (int step = -6; step <= 6; ++step) {
      const float id = (end + 0.5f * step) / max;
      float sum_xv = 0, sum_vv = 0;
      for (int i = 0; i < kQK; ++i) {
        trial[i] = static_cast<uint8_t>(NearestCode(id * x[i]));
        const float v = kIQ4Values[trial[i]];
        sum_xv += x[i] * v;
        sum_vv += v * v;
      }
      const float d = sum_xv / sum_vv;
      float err = 0;
      for (int i = 0; i < kQK; ++i) {
        const float diff = x[i] - d * kIQ4Values[trial[i]];
        err += diff * diff;
      }
      if (err < best_err) {
        best_err = err;
        best_d = d;
        std::memcpy(codes, trial, kQK);
      }
    }
  }
  return best_d;
}

// Codes of x against the decoded scale dl (as the dequantizer will multiply).
void MapToCodes(const float* x, float dl, uint8_t* codes) {
  for (int i = 0; i < kQK; ++i) codes[i] = static_cast<uint8_t>(dl == 0.0f ? 8 : NearestCode(x[i] / dl));
}

}  // namespace

void QuantizeRowIQ4_NL(const float* src, BlockIQ4_NL* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* x = src + b * kQK;
    uint8_t codes[kQK];
    dst[b].d = F32ToF16(FitCodebook(x, codes));
    MapToCodes(x, F16ToF32(dst[b].d), codes);
    PackCodes(codes, dst[b].qs);
  }
}

void QuantizeRowIQ4_XS(const float* src, BlockIQ4_XS* dst, int64_t n) {
  CHECK(n % kKBlockSize == 0);
  for (int64_t b = 0; b < n / kKBlockSize; ++b) {
    const float* x = src + b * kKBlockSize;
    BlockIQ4_XS& y = dst[b];
    uint8_t codes[kQK];
    float scales[8];
    for (int j = 0; j < 8; ++j) scales[j] = FitCodebook(x + kQK * j, codes);
    // The sub-block scale of largest magnitude maps to -32, the extra negative 6-bit level.
    const float max_scale = quant_internal::LargestMagnitude(scales, 8);
    y.d = F32ToF16(max_scale != 0.0f ? max_scale / -32.0f : 0.0f);
    const float d = F16ToF32(y.d);
    y.scales_h = 0;
    std::memset(y.scales_l, 0, sizeof(y.scales_l));
    for (int j = 0; j < 8; ++j) {
      const int l = d == 0.0f ? 0 : std::clamp(NearestInt(scales[j] / d), -32, 31);
      const int ls = l + 32;
      y.scales_l[j / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (j % 2)));
      y.scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * j));
      MapToCodes(x + kQK * j, d * l, codes);
      PackCodes(codes, y.qs + 16 * j);
    }
  }
}

// As ggml's dequantize_row_iq4_*: d * value, with d * (ls - 32) first for IQ4_XS.
void DequantizeRowIQ4_NL(const BlockIQ4_NL* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int i = 0; i < kQK; ++i) dst[b * kQK + i] = d * kIQ4Values[Nibble32(src[b].qs, i)];
  }
}

void DequantizeRowIQ4_XS(const BlockIQ4_XS* src, float* dst, int64_t n) {
  CHECK(n % kKBlockSize == 0);
  for (int64_t b = 0; b < n / kKBlockSize; ++b) {
    const BlockIQ4_XS& x = src[b];
    const float d = F16ToF32(x.d);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * (IQ4_XSScale(x, j) - 32);
      for (int i = 0; i < kQK; ++i) dst[b * kKBlockSize + kQK * j + i] = dl * kIQ4Values[Nibble32(x.qs + 16 * j, i)];
    }
  }
}

void VecDotRowsIQ4_NL(const BlockIQ4_NL* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq4_nl(rows, n_rows, a, n, out);
}

void VecDotRowsIQ4_XS(const BlockIQ4_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kKBlockSize == 0);
  quant_internal::ActiveRowKernels().iq4_xs(rows, n_rows, a, n, out);
}

void VecDotRowsIQ4_NLScalar(const BlockIQ4_NL* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ4_NL& x = rows[r * nb + b];
      int32_t isum = 0;
      for (int i = 0; i < kQK; ++i) isum += kIQ4Values[Nibble32(x.qs, i)] * a[b].qs[i];
      sum += static_cast<float>(isum) * (F16ToF32(x.d) * F16ToF32(a[b].d));
    }
    out[r] = sum;
  }
}

void VecDotRowsIQ4_XSScalar(const BlockIQ4_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kKBlockSize == 0);
  const int64_t nb = n / kKBlockSize;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ4_XS& x = rows[r * nb + b];
      int32_t sumi = 0;
      for (int j = 0; j < 8; ++j) {
        int32_t s = 0;
        for (int i = 0; i < kQK; ++i) s += kIQ4Values[Nibble32(x.qs + 16 * j, i)] * a[b].qs[kQK * j + i];
        sumi += (IQ4_XSScale(x, j) - 32) * s;
      }
      sum += F16ToF32(x.d) * a[b].d * static_cast<float>(sumi);
    }
    out[r] = sum;
  }
}

}  // namespace mer
