// The row kernels of one variant as a table of function pointers (internal to common/quant).
//
// The *_rows.cc files define them in namespace quant_internal::<variant> and are compiled once per
// SIMD variant (simd_internal.h); kernel_variant.cc builds the tables and picks the active one.
// Every kernel computes out[r] = dot(row r, a) for r in [0, n_rows) with rows of n elements, n
// valid for the type (checked by the public entry points, not here).
#pragma once

#include <cstdint>

#include "common/quant/blocks.h"
#include "common/quant/kernel_variant.h"

namespace mer::quant_internal {

template <typename W, typename A>
using RowsFn = void (*)(const W* rows, int64_t n_rows, const A* a, int64_t n, float* out);

struct RowKernels {
  RowsFn<float, float> f32;
  RowsFn<f16_bits, f16_bits> f16;
  RowsFn<bf16_bits, bf16_bits> bf16;
  RowsFn<BlockQ8_0, BlockQ8_0> q8_0;
  RowsFn<BlockQ4_0, BlockQ8_0> q4_0;
  RowsFn<BlockQ4_1, BlockQ8_1> q4_1;
  RowsFn<BlockQ5_0, BlockQ8_0> q5_0;
  RowsFn<BlockQ5_1, BlockQ8_1> q5_1;
  RowsFn<BlockQ2_K, BlockQ8_K> q2_k;
  RowsFn<BlockQ3_K, BlockQ8_K> q3_k;
  RowsFn<BlockQ4_K, BlockQ8_K> q4_k;
  RowsFn<BlockQ5_K, BlockQ8_K> q5_k;
  RowsFn<BlockQ6_K, BlockQ8_K> q6_k;
  RowsFn<BlockIQ4_NL, BlockQ8_0> iq4_nl;
  RowsFn<BlockIQ4_XS, BlockQ8_K> iq4_xs;
  RowsFn<BlockIQ2_XXS, BlockQ8_K> iq2_xxs;
  RowsFn<BlockIQ2_XS, BlockQ8_K> iq2_xs;
  RowsFn<BlockIQ3_XXS, BlockQ8_K> iq3_xxs;
  RowsFn<BlockIQ3_S, BlockQ8_K> iq3_s;
  RowsFn<BlockIQ2_S, BlockQ8_K> iq2_s;
  RowsFn<BlockIQ1_S, BlockQ8_K> iq1_s;
};

// The kernels of variant v (whether the CPU supports v is the caller's concern).
const RowKernels& RowKernelsOf(KernelVariant v);
// RowKernelsOf(ActiveKernelVariant()).
const RowKernels& ActiveRowKernels();

// The SIMD kernels each variant's compilation defines.
#define MER_QUANT_DECLARE_ROW_KERNELS                                                                    \
  void F32Rows(const float* rows, int64_t n_rows, const float* a, int64_t n, float* out);                \
  void F16Rows(const f16_bits* rows, int64_t n_rows, const f16_bits* a, int64_t n, float* out);          \
  void BF16Rows(const bf16_bits* rows, int64_t n_rows, const bf16_bits* a, int64_t n, float* out);       \
  void Q8_0Rows(const BlockQ8_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);       \
  void Q4_0Rows(const BlockQ4_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);       \
  void Q4_1Rows(const BlockQ4_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out);       \
  void Q5_0Rows(const BlockQ5_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);       \
  void Q5_1Rows(const BlockQ5_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out);       \
  void Q2_KRows(const BlockQ2_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);       \
  void Q3_KRows(const BlockQ3_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);       \
  void Q4_KRows(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);       \
  void Q5_KRows(const BlockQ5_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);       \
  void Q6_KRows(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);       \
  void IQ4_NLRows(const BlockIQ4_NL* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out);   \
  void IQ4_XSRows(const BlockIQ4_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);   \
  void IQ2_XXSRows(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out); \
  void IQ3_XXSRows(const BlockIQ3_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out); \
  void IQ2_XSRows(const BlockIQ2_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);   \
  void IQ3_SRows(const BlockIQ3_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);     \
  void IQ2_SRows(const BlockIQ2_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);     \
  void IQ1_SRows(const BlockIQ1_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out);

namespace avx2 {
MER_QUANT_DECLARE_ROW_KERNELS
}  // namespace avx2
namespace avx512 {
MER_QUANT_DECLARE_ROW_KERNELS
}  // namespace avx512

#undef MER_QUANT_DECLARE_ROW_KERNELS

}  // namespace mer::quant_internal
