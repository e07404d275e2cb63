// Q4_K rows (n a multiple of 256), dotted with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// A quantizer in the style of ggml's quantize_row_q4_K_ref (per sub-block a weighted search for
// the scale and min, make_qkx2_quants style, then 6-bit quantization of scales and mins). Meant
// for writing synthetic model files; the bytes need not match ggml's.
void QuantizeRowQ4_K(const float* src, BlockQ4_K* dst, int64_t n);
void DequantizeRowQ4_K(const BlockQ4_K* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block, d_w * d_a * sum_j sc[j] * (int sum of q * a over
// sub-block j) - dmin_w * d_a * sum_j m[j] * (bsums of sub-block j), in f32.
// out[r] does not depend on n_rows.
void VecDotRowsQ4_K(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// The avx2 variant's kernel, whichever variant VecDotRowsQ4_K runs (kernel_variant.h).
void VecDotRowsQ4_KAvx2(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// ggml's generic C code.
void VecDotRowsQ4_KScalar(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
