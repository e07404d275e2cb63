// Q2_K rows (n a multiple of 256), dotted with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// Per 16-element sub-block a scale and min fit to the levels [0, 3] (scale_fit.h), both as
// 4-bit codes under f16 d and dmin, then every element requantized against the decoded scales.
// Meant for writing synthetic model files; the bytes need not match ggml's.
void QuantizeRowQ2_K(const float* src, BlockQ2_K* dst, int64_t n);
void DequantizeRowQ2_K(const BlockQ2_K* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block, first -(d_a * dmin_w) times 8 int32 lanes of
// min-weighted bsums (lane k: sub-blocks 2k, 2k + 1), then d_w * d_a times 8 int32 lanes of
// scaled sums, both by fused multiply-adds into one 8-lane f32 accumulator (ggml's AVX2 order).
// out[r] does not depend on n_rows.
void VecDotRowsQ2_K(const BlockQ2_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// A plain reference: per block the integer sums times the f32 scales, added in block order.
void VecDotRowsQ2_KScalar(const BlockQ2_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
