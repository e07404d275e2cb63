// F32, F16 and BF16 rows: conversions and dot products (any n >= 0; no alignment needed).
// ggml pairs float weights with activations of the same type, rounded from f32 with
// round-to-nearest-even (F32ToF16 / F32ToBF16 of half.h), and multiplies in f32.
#pragma once

#include <cstdint>

#include "common/tensor/half.h"

namespace mer {

void ConvertF32ToF16(const float* src, f16_bits* dst, int64_t n);
void ConvertF16ToF32(const f16_bits* src, float* dst, int64_t n);
void ConvertF32ToBF16(const float* src, bf16_bits* dst, int64_t n);
void ConvertBF16ToF32(const bf16_bits* src, float* dst, int64_t n);

// out[r] = sum_i w[r * n + i] * a[i] for r in [0, n_rows): f32 products (F16/BF16 widened to f32
// first, as ggml does) summed in f32 SIMD lanes, by the active kernel variant (kernel_variant.h).
// out[r] does not depend on n_rows.
void VecDotRowsF32(const float* rows, int64_t n_rows, const float* a, int64_t n, float* out);
void VecDotRowsF16(const f16_bits* rows, int64_t n_rows, const f16_bits* a, int64_t n, float* out);
void VecDotRowsBF16(const bf16_bits* rows, int64_t n_rows, const bf16_bits* a, int64_t n, float* out);

// Scalar references (ggml's generic C code: f32 products summed in double).
void VecDotRowsF32Scalar(const float* rows, int64_t n_rows, const float* a, int64_t n, float* out);
void VecDotRowsF16Scalar(const f16_bits* rows, int64_t n_rows, const f16_bits* a, int64_t n, float* out);
void VecDotRowsBF16Scalar(const bf16_bits* rows, int64_t n_rows, const bf16_bits* a, int64_t n, float* out);

}  // namespace mer
