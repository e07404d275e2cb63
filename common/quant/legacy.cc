#include "common/quant/legacy.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::NearestInt;

constexpr int kQK = kQ8_0BlockSize;

// The 5-bit code (q in [0, 31]) of element i of a block; the 4-bit ones are Nibble32.
inline int Code5(const uint8_t* qs, const uint8_t* qh, int i) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  return Nibble32(qs, i) | static_cast<int>(((h >> i) & 1) << 4);
}

void PackCodes(const int* q, int bits, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>((q[i] & 0xF) | ((q[i + 16] & 0xF) << 4));
  if (bits == 5) {
    for (int i = 0; i < kQK; ++i) h |= static_cast<uint32_t>(q[i] >> 4) << i;
    std::memcpy(qh, &h, 4);
  }
}

// Symmetric: the element of largest magnitude maps to -half (q = 0); d as decoded.
f16_bits QuantizeSymmetric(const float* x, int half, int* q) {
  const float max = quant_internal::LargestMagnitude(x, kQK);
  const f16_bits d16 = F32ToF16(max / static_cast<float>(-half));
  const float d = F16ToF32(d16);
  for (int i = 0; i < kQK; ++i) q[i] = d == 0.0f ? half : std::clamp(NearestInt(x[i] / d) + half, 0, 2 * half - 1);
  return d16;
}

// Asymmetric: [min, max] onto [0, levels - 1]; d and m as decoded.
void QuantizeAsymmetric(const float* x, int levels, int* q, f16_bits* d_out, f16_bits* m_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < kQK; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  *d_out = F32ToF16((hi - lo) / static_cast<float>(levels - 1));
  *m_out = F32ToF16(lo);
  const float d = F16ToF32(*d_out), m = F16ToF32(*m_out);
  for (int i = 0; i < kQK; ++i) q[i] = d == 0.0f ? 0 : std::clamp(NearestInt((x[i] - m) / d), 0, levels - 1);
}

}  // namespace

void QuantizeRowQ4_0(const float* src, BlockQ4_0* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    int q[kQK];
    dst[b].d = QuantizeSymmetric(src + b * kQK, 8, q);
    PackCodes(q, 4, dst[b].qs, nullptr);
  }
}

void QuantizeRowQ4_1(const float* src, BlockQ4_1* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    int q[kQK];
    QuantizeAsymmetric(src + b * kQK, 16, q, &dst[b].d, &dst[b].m);
    PackCodes(q, 4, dst[b].qs, nullptr);
  }
}

void QuantizeRowQ5_0(const float* src, BlockQ5_0* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    int q[kQK];
    dst[b].d = QuantizeSymmetric(src + b * kQK, 16, q);
    PackCodes(q, 5, dst[b].qs, dst[b].qh);
  }
}

void QuantizeRowQ5_1(const float* src, BlockQ5_1* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    int q[kQK];
    QuantizeAsymmetric(src + b * kQK, 32, q, &dst[b].d, &dst[b].m);
    PackCodes(q, 5, dst[b].qs, dst[b].qh);
  }
}

// As ggml's dequantize_row_*: d * (q - offset), or d * q + m.
void DequantizeRowQ4_0(const BlockQ4_0* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int i = 0; i < kQK; ++i) dst[b * kQK + i] = static_cast<float>(Nibble32(src[b].qs, i) - 8) * d;
  }
}

void DequantizeRowQ4_1(const BlockQ4_1* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d), m = F16ToF32(src[b].m);
    for (int i = 0; i < kQK; ++i) dst[b * kQK + i] = static_cast<float>(Nibble32(src[b].qs, i)) * d + m;
  }
}

void DequantizeRowQ5_0(const BlockQ5_0* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int i = 0; i < kQK; ++i) dst[b * kQK + i] = static_cast<float>(Code5(src[b].qs, src[b].qh, i) - 16) * d;
  }
}

void DequantizeRowQ5_1(const BlockQ5_1* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d), m = F16ToF32(src[b].m);
    for (int i = 0; i < kQK; ++i) dst[b * kQK + i] = static_cast<float>(Code5(src[b].qs, src[b].qh, i)) * d + m;
  }
}

void VecDotRowsQ4_0(const BlockQ4_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q4_0(rows, n_rows, a, n, out);
}

void VecDotRowsQ4_1(const BlockQ4_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q4_1(rows, n_rows, a, n, out);
}

void VecDotRowsQ5_0(const BlockQ5_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q5_0(rows, n_rows, a, n, out);
}

void VecDotRowsQ5_1(const BlockQ5_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().q5_1(rows, n_rows, a, n, out);
}

namespace {

// The scalar references: `code(block, i)` the signed or unsigned quant, `min_term(block, a)` the
// m * s term of the asymmetric formats.
template <typename W, typename A, typename Code, typename MinTerm>
void ScalarRows(const W* rows, int64_t n_rows, const A* a, int64_t n, float* out, Code code, MinTerm min_term) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const W& x = rows[r * nb + b];
      int32_t isum = 0;
      for (int i = 0; i < kQK; ++i) isum += code(x, i) * a[b].qs[i];
      sum += static_cast<float>(isum) * (F16ToF32(x.d) * F16ToF32(a[b].d)) + min_term(x, a[b]);
    }
    out[r] = sum;
  }
}

constexpr auto kNoMin = [](const auto&, const auto&) { return 0.0f; };
constexpr auto kMin = [](const auto& x, const BlockQ8_1& y) { return F16ToF32(x.m) * F16ToF32(y.s); };

}  // namespace

void VecDotRowsQ4_0Scalar(const BlockQ4_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  ScalarRows(
      rows, n_rows, a, n, out, [](const BlockQ4_0& x, int i) { return Nibble32(x.qs, i) - 8; }, kNoMin);
}

void VecDotRowsQ4_1Scalar(const BlockQ4_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out) {
  ScalarRows(
      rows, n_rows, a, n, out, [](const BlockQ4_1& x, int i) { return Nibble32(x.qs, i); }, kMin);
}

void VecDotRowsQ5_0Scalar(const BlockQ5_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  ScalarRows(
      rows, n_rows, a, n, out, [](const BlockQ5_0& x, int i) { return Code5(x.qs, x.qh, i) - 16; }, kNoMin);
}

void VecDotRowsQ5_1Scalar(const BlockQ5_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out) {
  ScalarRows(
      rows, n_rows, a, n, out, [](const BlockQ5_1& x, int i) { return Code5(x.qs, x.qh, i); }, kMin);
}

}  // namespace mer
