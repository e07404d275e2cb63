// IQ3_XXS and IQ3_S rows (n a multiple of 256), about 3.06 and 3.44 bits a weight: groups of 4
// elements on a grid of 256 or 512 points, signs per 8 elements (IQ3_XXS: 7 free, IQ3_S: 8),
// dotted with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// The formats' grids (iq3_grids.cc): 4 magnitude codes per entry, one per byte.
extern const uint32_t kIQ3_XXSGrid[256];
extern const uint32_t kIQ3_SGrid[512];

// IQ2_XXS's quantizer (iq2.h) on this grid: each group of 8 takes its elements' signs (the
// smallest one's flipped where their number is odd), each half of it the closest of a few grid
// points to its magnitudes; sub-block scales by trial and least squares, as 4-bit codes under one
// f16 d. Meant for writing synthetic model files; the bytes need not match ggml's.
void QuantizeRowIQ3_XXS(const float* src, BlockIQ3_XXS* dst, int64_t n);
void DequantizeRowIQ3_XXS(const BlockIQ3_XXS* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): IQ2_XXS's arithmetic (iq2.h) with the grid codes of IQ3_XXS,
// and 0.25 times the horizontal sum (ggml's AVX2 vec_dot). out[r] does not depend on n_rows.
void VecDotRowsIQ3_XXS(const BlockIQ3_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// A plain reference: per block the integer sums times the f32 scales, added in block order.
void VecDotRowsIQ3_XXSScalar(const BlockIQ3_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

// IQ3_XXS's quantizer on IQ3_S's grid, each element keeping its own sign, the sub-block scales as
// 4-bit codes of d * (2 ls + 1).
void QuantizeRowIQ3_S(const float* src, BlockIQ3_S* dst, int64_t n);
void DequantizeRowIQ3_S(const BlockIQ3_S* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): IQ3_XXS's arithmetic with IQ3_S's grid codes, signs and scales
// (2 ls + 1), and the horizontal sum itself (ggml's AVX2 vec_dot). out[r] does not depend on
// n_rows.
void VecDotRowsIQ3_S(const BlockIQ3_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// A plain reference: per block the integer sums times the f32 scales, added in block order.
void VecDotRowsIQ3_SScalar(const BlockIQ3_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
