// Q6_K rows (n a multiple of 256), dotted with Q8_K activations as in ggml.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// A quantizer in the style of ggml's quantize_row_q6_K_ref (per 16-element sub-block a search of
// the signed scale, make_qx_quants style, then 8-bit sub-block scales under one f16 d). Meant for
// writing synthetic model files; the bytes need not match ggml's.
void QuantizeRowQ6_K(const float* src, BlockQ6_K* dst, int64_t n);
void DequantizeRowQ6_K(const BlockQ6_K* src, float* dst, int64_t n);

// out[r] = dot(weight row r, a): per block, d_w * d_a * sum_j scales[j] * (int sum of (q - 32) * a
// over sub-block j), in f32. out[r] does not depend on n_rows.
void VecDotRowsQ6_K(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// The avx2 variant's kernel, whichever variant VecDotRowsQ6_K runs (kernel_variant.h).
void VecDotRowsQ6_KAvx2(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);
// ggml's generic C code.
void VecDotRowsQ6_KScalar(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

}  // namespace mer
