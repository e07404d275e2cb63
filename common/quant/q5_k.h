// Q5_K rows (n a multiple of 256), dotted with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// Q4_K's quantizer with 32 levels (scale_fit.h). Meant for writing synthetic model files; the
// bytes need not match ggml's.
void QuantizeRowQ5_K(const float* src, BlockQ5_K* dst, int64_t n);
void DequantizeRowQ5_K(const BlockQ5_K* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block, d_w * d_a * (int sum over sub-blocks j of sc[j] times
// the sum of q * a over j), accumulated in f32 over 8 lanes, plus the dmin term
// -(d_a * dmin_w) * sum_j m[j] * (bsums of j), accumulated per block in one f32 (ggml's AVX2
// order, fused multiply-adds). out[r] does not depend on n_rows.
void VecDotRowsQ5_K(const BlockQ5_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// A plain reference: per block the integer sums times the f32 scales, added in block order.
void VecDotRowsQ5_KScalar(const BlockQ5_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
