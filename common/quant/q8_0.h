// Q8_0 rows (n a multiple of 32): 32 int8 quants per block with one f16 scale.
// Q8_0 weights are dotted with Q8_0 activations, as in ggml. Q8_1, the same with the quants' sum
// times d, is the activation format of Q4_1 and Q5_1.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// Activation quantizer, bit-identical to what ggml's x86 CPU backend (its AVX2
// quantize_row_q8_0) makes of f32 activations: amax = max |x|, d = amax / 127 stored as f16,
// q = x * (127 / amax) rounded half to even. A zero block gets d = 0 and q = 0.
void QuantizeRowQ8_0(const float* src, BlockQ8_0* dst, int64_t n);
// ggml's reference quantizer (quantize_row_q8_0_ref, used when writing Q8_0 weight files):
// id = 1 / d from the f32 d, q = roundf(x * id) (half away from zero).
void QuantizeRowQ8_0Reference(const float* src, BlockQ8_0* dst, int64_t n);
void DequantizeRowQ8_0(const BlockQ8_0* src, float* dst, int64_t n);

// QuantizeRowQ8_0's quants and d, and s = d * (sum of the quants) with d in f32 before its
// rounding to f16: ggml's AVX2 quantize_row_q8_1, bit for bit.
void QuantizeRowQ8_1(const float* src, BlockQ8_1* dst, int64_t n);
void DequantizeRowQ8_1(const BlockQ8_1* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block, the exact int32 sum of products times
// f16(d_w) * f16(d_a), summed in f32. out[r] does not depend on n_rows. Weight quants may be any
// int8; activation quants must lie in [-127, 127], as QuantizeRowQ8_0 makes them (the avx2
// variant's kernel, like ggml's, negates them).
void VecDotRowsQ8_0(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);
// ggml's generic C code.
void VecDotRowsQ8_0Scalar(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);

}  // namespace mer
