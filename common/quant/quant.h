// Row kernels on ggml tensor types: conversion from/to f32 and dot products, with the numerics of
// llama.cpp's (ggml's) CPU backend so that mer's CPU engine reproduces its tokens and logits.
//
// Supported types and sizes: F32, F16, BF16 (any n >= 0), Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1,
// IQ4_NL (n a multiple of 32), the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_XS, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and IQ1_S (n a multiple of 256). Sizes are CHECKed. Row pointers need
// no particular alignment. None of these functions allocates.
//
// Per-format entry points (scalar references included, for tests) live in float_dot.h and one
// header per format (q8_0.h, q8_k.h, q4_k.h, ...); the block structs in blocks.h. The dot
// products run the kernel variant (AVX-512, AVX2 or scalar) chosen at run time:
// kernel_variant.h.
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"
#include "common/tensor/ggml_type.h"

namespace mer {

// The activation ("vec_dot") type ggml's CPU backend pairs with each weight type:
// F32->F32, F16->F16, BF16->BF16, Q4_0, Q5_0, Q8_0, IQ4_NL->Q8_0, Q4_1, Q5_1->Q8_1, the
// K-quants, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and IQ1_S->Q8_K. CHECKs other types.
GgmlType ActivationTypeFor(GgmlType weight_type);

// f32 -> `type` for n values. For the activation types (F32, F16, BF16, Q8_0, Q8_1, Q8_K) the
// bytes are those ggml's x86 CPU backend produces when it converts activations for a matrix
// multiply.
// Q8_0 note: that is ggml's AVX2 quantize_row_q8_0 (scale 127/amax, round half to even), which
// differs in rare ties and last-ulp cases from the reference quantizer used to write Q8_0 weight
// files; QuantizeRowQ8_0Reference (q8_0.h) gives the latter.
// For the other types it is a good quantizer in the style of ggml's reference ones (for writing
// synthetic model files), not bit-identical to them.
void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n);

// `type` -> f32, exactly the format's definition (as ggml's dequantize_row_*).
void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n);

// Dot product of one weight row (weight_type) with one activation row in
// ActivationTypeFor(weight_type). Float rows multiply in f32 (F16/BF16 converted to f32 first);
// Q8_0 takes per-block integer sums times d_w * d_a; the K-quants take Q8_K integer sums per
// sub-block and the bsums for the dmin term, then scale in f32 (each format's header says how).
// The AVX-512 and AVX2 variants give the same bits, ggml's AVX2 ones.
float VecDot(GgmlType weight_type, const void* weight_row, const void* activation_row, int64_t n);

// VecDot of n_rows consecutive weight rows (row stride RowBytes(weight_type, n)) against one
// activation row: out[r]. The decode hot loop; out[r] equals VecDot of row r bit for bit.
void VecDotRows(GgmlType weight_type, const void* weight_rows, int64_t n_rows, const void* activation_row, int64_t n,
                float* out);

// The name of the kernel variant VecDotRows runs in this process, chosen at run time
// (kernel_variant.h): "avx512", "avx2" or "scalar".
const char* QuantKernelIsa();

}  // namespace mer
