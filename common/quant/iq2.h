// IQ2_XXS, IQ2_XS and IQ2_S rows (n a multiple of 256), about 2.06, 2.31 and 2.56 bits a weight:
// groups of 8 elements on a grid of 256, 512 or 1024 points with 7 free signs (IQ2_S: 8), dotted
// with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// The formats' grids (iq2_grids.cc): 8 magnitude codes per entry, one per byte.
extern const uint64_t kIQ2_XXSGrid[256];
extern const uint64_t kIQ2_XSGrid[512];
extern const uint64_t kIQ2_SGrid[1024];

// Per 32-element sub-block: each group of 8 takes the signs of its elements (the smallest one's
// flipped where their number is odd); its magnitudes go to the grid point closest to them among
// those nearest to the pattern of nearest levels (8, 25, 43) and to the patterns one level away
// in one element; the sub-block scale is the best of a few trial scales; the 8 scales become 4-bit
// codes under one f16 d, and the groups are mapped again against the decoded scales. IQ2_XS the
// same with a scale per 16 elements. Meant for writing synthetic model files; the bytes need not
// match ggml's.
void QuantizeRowIQ2_XXS(const float* src, BlockIQ2_XXS* dst, int64_t n);
void QuantizeRowIQ2_XS(const float* src, BlockIQ2_XS* dst, int64_t n);
void DequantizeRowIQ2_XXS(const BlockIQ2_XXS* src, float* dst, int64_t n);
void DequantizeRowIQ2_XS(const BlockIQ2_XS* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block 8 int32 lanes, lane k the sum over the 8 sub-blocks j
// of (2 ls[j] + 1) times the products of bytes 4k .. 4k + 3 of j's 32 elements (grid byte times
// signed activation), into an 8-lane f32 accumulator by one fused multiply-add with d_w * d_a;
// the result is 0.125 times its horizontal sum (ggml's AVX2 vec_dot). IQ2_XS the same with the
// scale of lanes 0-3 from a sub-block's first 16 elements and of lanes 4-7 from its last 16.
// out[r] does not depend on n_rows.
void VecDotRowsIQ2_XXS(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
void VecDotRowsIQ2_XS(const BlockIQ2_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// A plain reference: per block the integer sums times the f32 scales, added in block order.
void VecDotRowsIQ2_XXSScalar(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
void VecDotRowsIQ2_XSScalar(const BlockIQ2_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

// IQ2_XS's quantizer on IQ2_S's grid, each element keeping its own sign.
void QuantizeRowIQ2_S(const float* src, BlockIQ2_S* dst, int64_t n);
void DequantizeRowIQ2_S(const BlockIQ2_S* src, float* dst, int64_t n);
// out[r] = dot(weight row r, a): IQ2_XS's arithmetic with IQ2_S's grid codes and signs.
void VecDotRowsIQ2_S(const BlockIQ2_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
void VecDotRowsIQ2_SScalar(const BlockIQ2_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
