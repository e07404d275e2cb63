// The 32-element formats Q4_0, Q4_1, Q5_0 and Q5_1 (n a multiple of 32), dotted as in ggml: Q4_0
// and Q5_0 with Q8_0 activations, Q4_1 and Q5_1 with Q8_1.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// Round-to-nearest quantizers: Q4_0 and Q5_0 map the element of largest magnitude to the most
// negative level (-8, -16), Q4_1 and Q5_1 the block's range onto [0, 15], [0, 31] with m its
// minimum; every element is then rounded against the f16 scale as it will be decoded. Meant for
// writing synthetic model files; the bytes need not match ggml's.
void QuantizeRowQ4_0(const float* src, BlockQ4_0* dst, int64_t n);
void QuantizeRowQ4_1(const float* src, BlockQ4_1* dst, int64_t n);
void QuantizeRowQ5_0(const float* src, BlockQ5_0* dst, int64_t n);
void QuantizeRowQ5_1(const float* src, BlockQ5_1* dst, int64_t n);
void DequantizeRowQ4_0(const BlockQ4_0* src, float* dst, int64_t n);
void DequantizeRowQ4_1(const BlockQ4_1* src, float* dst, int64_t n);
void DequantizeRowQ5_0(const BlockQ5_0* src, float* dst, int64_t n);
void DequantizeRowQ5_1(const BlockQ5_1* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a). Per block an exact int32 sum of the products:
//   Q4_0: per row one f32, acc = fma(sum, d_w * d_a, acc) block after block: the order of ggml's
//         8-row gemv, which llama.cpp runs for every Q4_0 matrix with a multiple of 8 rows (it
//         repacks them on AVX2 hosts); for the other row counts its vec_dot adds in 8 lanes.
//   Q5_0: 8 int32 lanes (4 products each) into an 8-lane f32 accumulator by fused multiply-adds
//         with d_w * d_a, then its horizontal sum (ggml's AVX2 vec_dot).
//   Q4_1, Q5_1: as Q5_0, plus m_w * s_a per block into a scalar f32 by fused multiply-adds,
//         added to the horizontal sum at the end.
// out[r] does not depend on n_rows.
void VecDotRowsQ4_0(const BlockQ4_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);
void VecDotRowsQ4_1(const BlockQ4_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out);
void VecDotRowsQ5_0(const BlockQ5_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);
void VecDotRowsQ5_1(const BlockQ5_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out);
// Plain references: per block the integer sum times the f32 scales, added in block order.
void VecDotRowsQ4_0Scalar(const BlockQ4_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);
void VecDotRowsQ4_1Scalar(const BlockQ4_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out);
void VecDotRowsQ5_0Scalar(const BlockQ5_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);
void VecDotRowsQ5_1Scalar(const BlockQ5_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out);

}  // namespace mer
