// IQ1_S rows (n a multiple of 256), about 1.56 bits a weight: groups of 8 elements on a grid of
// 2048 points of values -1, 0 and 1, shifted per 32 elements by +-1/8 of the sub-block scale,
// dotted with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// The format's grid (iq1_grids.cc): 8 signed values per entry, one per byte.
extern const uint64_t kIQ1_SGrid[2048];

// Per 32-element sub-block, for either sign of the offset, trial scales each followed by the
// grid point of every group of 8 (the closest of those nearest to the pattern of nearest values
// and to the patterns one value away in one element) and the least-squares scale of those points;
// the least squared error wins. The 8 scales become 3-bit codes of d * (2 ls + 1) under one f16 d,
// and the groups are mapped again against the decoded scales, the offset's sign chosen again too.
// Meant for writing synthetic model files; the bytes need not match ggml's.
void QuantizeRowIQ1_S(const float* src, BlockIQ1_S* dst, int64_t n);
void DequantizeRowIQ1_S(const BlockIQ1_S* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block 8 int32 lanes, lane k the sum over the 8 sub-blocks j
// of (2 ls[j] + 1) times the products of bytes 4k .. 4k + 3 of j's 32 elements (grid value times
// activation), into an 8-lane f32 accumulator by one fused multiply-add with d = d_a * d_w; and
// per block one int32, the sum over j of +-(2 ls[j] + 1) times the sum of j's activations (from
// the bsums; minus where j's offset is negative), into a scalar f32 by a fused multiply-add with
// d. The result is the 8-lane horizontal sum plus kIQ1_SDelta times the scalar (ggml's AVX2
// vec_dot). out[r] does not depend on n_rows.
void VecDotRowsIQ1_S(const BlockIQ1_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// A plain reference: per block the integer sums times the f32 scales, added in block order.
void VecDotRowsIQ1_SScalar(const BlockIQ1_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
