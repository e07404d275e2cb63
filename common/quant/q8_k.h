// Q8_K rows (n a multiple of 256): the activation format of Q4_K and Q6_K dot products.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"

namespace mer {

// Bit-identical to ggml's quantize_row_q8_K (which its x86 backend uses as is): max = the first
// element of largest magnitude, iscale = -127 / max, q = min(127, nearest-even(iscale * x)),
// d = 1 / iscale, bsums over 16. An all-zero block gets d = 0, q = 0 and bsums = 0 (ggml leaves
// its bsums unwritten; they are multiplied by d = 0 anyway).
void QuantizeRowQ8_K(const float* src, BlockQ8_K* dst, int64_t n);
void DequantizeRowQ8_K(const BlockQ8_K* src, float* dst, int64_t n);

}  // namespace mer
