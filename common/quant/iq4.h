// IQ4_NL (n a multiple of 32, Q8_0 activations) and IQ4_XS (n a multiple of 256, Q8_K
// activations): 4-bit codes into the non-uniform codebook kIQ4Values (blocks.h), dotted as in
// ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// Per 32 elements a scale fit to the codebook (trial scales around the ones mapping the element
// of largest magnitude to either end of the codebook, each refined by least squares), then every
// element mapped to its nearest codebook value; IQ4_XS quantizes the 8 sub-block scales to 6-bit
// codes under one f16 d and maps the elements again against the decoded scales. Meant for writing
// synthetic model files; the bytes need not match ggml's.
void QuantizeRowIQ4_NL(const float* src, BlockIQ4_NL* dst, int64_t n);
void QuantizeRowIQ4_XS(const float* src, BlockIQ4_XS* dst, int64_t n);
void DequantizeRowIQ4_NL(const BlockIQ4_NL* src, float* dst, int64_t n);
void DequantizeRowIQ4_XS(const BlockIQ4_XS* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a).
//   IQ4_NL: Q4_0's order (legacy.h): per row one f32, acc = fma(block sum, d_w * d_a, acc),
//           the order of the 8-row gemv ggml runs on repacked IQ4_NL matrices.
//   IQ4_XS: per block 8 int32 lanes, lane k the sum over the 8 sub-blocks j of (ls[j] - 32) times
//           the products of bytes 4k .. 4k + 3 of j's 32 elements, into an 8-lane f32 accumulator
//           by one fused multiply-add with d_w * d_a; then its horizontal sum (ggml's AVX2
//           vec_dot).
// out[r] does not depend on n_rows.
void VecDotRowsIQ4_NL(const BlockIQ4_NL* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);
void VecDotRowsIQ4_XS(const BlockIQ4_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// Plain references: per block the integer sums times the f32 scales, added in block order.
void VecDotRowsIQ4_NLScalar(const BlockIQ4_NL* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);
void VecDotRowsIQ4_XSScalar(const BlockIQ4_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
