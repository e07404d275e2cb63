// The scale searches the quantizers of common/quant share (internal): for one sub-block of n
// values, the scale (and min) under which rounding to a few integer levels loses least. In the
// style of ggml's make_qkx2_quants and make_qx_quants; the quantizers only need valid blocks
// that decode close to their input, and the same bytes on every host (the library is built
// without floating-point contraction).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/tensor/half.h"

namespace mer::quant_internal {

// v rounded to the nearest integer, half to even (ggml's nearest_int), for |v| < 2^22.
inline int NearestInt(float v) {
  const float biased = v + 12582912.0f;  // 1.5 * 2^23: rounds half to even into the low bits
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// The element of x[0..n) of largest magnitude, with its sign (the first of equals; 0 where all
// are 0): the signed scale searches map it to the one extra negative level of their codes.
inline float LargestMagnitude(const float* x, int n) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max;
}

// The code ls in [0, max_code] of a sub-block scale s = d * (2 ls + 1) / k, the grid quantizers'
// odd multiples of d (IQ1_S, IQ2_*, IQ3_*); 0 where d is 0.
inline int OddScaleCode(float s, float d, float k, int max_code) {
  return d == 0.0f ? 0 : std::clamp(NearestInt((k * s / d - 1.0f) / 2.0f), 0, max_code);
}

// The block scale d, rounded to f16, under which OddScaleCode codes the sub-block scales
// scales[0..n): d * (2 max_code + 1) / k is the largest of them, which gets ls = max_code.
inline f16_bits OddScaleBlockScale(const float* scales, int n, float k, int max_code) {
  const float max_scale = *std::max_element(scales, scales + n);
  return F32ToF16(max_scale * k / static_cast<float>(2 * max_code + 1));
}

// Fits x[i] ~ scale * L[i] - min over n values, L[i] in [0, nmax], min >= 0, minimising the
// squared error weighted by w: a start from the (lo, hi) range, then 21 trial inverse scales
// around nmax / (hi - lo), each followed by the closed-form least-squares scale and offset for
// its L. Returns scale; *min_out = min. n <= 32.
float FitScaleMin(const float* x, const float* w, int n, int nmax, uint8_t* L, float* min_out);

// FitScaleMin with the weights the K-quant quantizers give a sub-block (as ggml does without an
// importance matrix): w[i] = rms(x) + |x[i]|. n <= 32.
float FitRmsWeightedScaleMin(const float* x, int n, int nmax, uint8_t* L, float* min_out);

// Fits x[i] ~ scale * (L[i] - nmax) with L[i] in [0, 2 nmax - 1] over n values, weighting by
// x^2: the largest-magnitude element maps to -nmax (the one extra negative level), then 18 trial
// inverse scales around nmax / max, keeping the least-squares scale of the best. Returns the
// (signed) scale; all L = nmax where every |x| < 1e-15.
float FitSignedScale(const float* x, int n, int nmax, uint8_t* L);

// The Q4_K and Q5_K block quantizer but for the packing of the quants: per 32-element sub-block
// a FitRmsWeightedScaleMin to [0, nmax]; the scales and mins as 6-bit codes under f16 d and dmin, packed into
// scales[12] as blocks.h describes; then every element requantized against the decoded scales
// and mins into L[256], L in [0, nmax].
void QuantizeScaleMinBlock(const float* x, int nmax, uint8_t* scales, f16_bits* d, f16_bits* dmin, uint8_t* L);

}  // namespace mer::quant_internal
