// Q3_K rows (n a multiple of 256), dotted with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// Per 16-element sub-block a signed scale fit to the levels [-4, 3] (scale_fit.h), the scales as
// 6-bit codes under one f16 d, then every element requantized against the decoded scales. Meant
// for writing synthetic model files; the bytes need not match ggml's.
void QuantizeRowQ3_K(const float* src, BlockQ3_K* dst, int64_t n);
void DequantizeRowQ3_K(const BlockQ3_K* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block, d_w * d_a * (int sum over sub-blocks j of
// (sc[j] - 32) times the sum of q * a over j), accumulated in f32 over 8 lanes (ggml's AVX2
// order). out[r] does not depend on n_rows.
void VecDotRowsQ3_K(const BlockQ3_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// A plain reference: per block the integer sum times the f32 scales, added in block order.
void VecDotRowsQ3_KScalar(const BlockQ3_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
