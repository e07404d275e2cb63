// Dispatch from GgmlType to the per-format kernels.
#include "common/quant/quant.h"

#include <cstring>

#include "common/base/check.h"
#include "common/quant/float_dot.h"
#include "common/quant/iq1.h"
#include "common/quant/iq2.h"
#include "common/quant/iq3.h"
#include "common/quant/iq4.h"
#include "common/quant/kernel_variant.h"
#include "common/quant/legacy.h"
#include "common/quant/q2_k.h"
#include "common/quant/q3_k.h"
#include "common/quant/q4_k.h"
#include "common/quant/q5_k.h"
#include "common/quant/q6_k.h"
#include "common/quant/q8_0.h"
#include "common/quant/q8_k.h"
#include "common/quant/row_kernels.h"

namespace mer {

GgmlType ActivationTypeFor(GgmlType weight_type) {
  switch (weight_type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
      return weight_type;
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kIQ4_NL:
      return GgmlType::kQ8_0;
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
      return GgmlType::kQ8_1;
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
    case GgmlType::kQ6_K:
    case GgmlType::kIQ4_XS:
    case GgmlType::kIQ2_XXS:
    case GgmlType::kIQ2_XS:
    case GgmlType::kIQ3_XXS:
    case GgmlType::kIQ3_S:
    case GgmlType::kIQ2_S:
    case GgmlType::kIQ1_S:
      return GgmlType::kQ8_K;
    default:
      break;
  }
  CHECK_MSG(false, "not a weight type");
}

void QuantizeRow(GgmlType type, const float* src, void* dst, int64_t n) {
  CHECK(IsRowSizeValid(type, n));
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      return ConvertF32ToF16(src, static_cast<f16_bits*>(dst), n);
    case GgmlType::kBF16:
      return ConvertF32ToBF16(src, static_cast<bf16_bits*>(dst), n);
    case GgmlType::kQ8_0:
      return QuantizeRowQ8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case GgmlType::kQ8_1:
      return QuantizeRowQ8_1(src, static_cast<BlockQ8_1*>(dst), n);
    case GgmlType::kQ4_0:
      return QuantizeRowQ4_0(src, static_cast<BlockQ4_0*>(dst), n);
    case GgmlType::kQ4_1:
      return QuantizeRowQ4_1(src, static_cast<BlockQ4_1*>(dst), n);
    case GgmlType::kQ5_0:
      return QuantizeRowQ5_0(src, static_cast<BlockQ5_0*>(dst), n);
    case GgmlType::kQ5_1:
      return QuantizeRowQ5_1(src, static_cast<BlockQ5_1*>(dst), n);
    case GgmlType::kQ8_K:
      return QuantizeRowQ8_K(src, static_cast<BlockQ8_K*>(dst), n);
    case GgmlType::kQ2_K:
      return QuantizeRowQ2_K(src, static_cast<BlockQ2_K*>(dst), n);
    case GgmlType::kQ3_K:
      return QuantizeRowQ3_K(src, static_cast<BlockQ3_K*>(dst), n);
    case GgmlType::kQ4_K:
      return QuantizeRowQ4_K(src, static_cast<BlockQ4_K*>(dst), n);
    case GgmlType::kQ5_K:
      return QuantizeRowQ5_K(src, static_cast<BlockQ5_K*>(dst), n);
    case GgmlType::kQ6_K:
      return QuantizeRowQ6_K(src, static_cast<BlockQ6_K*>(dst), n);
    case GgmlType::kIQ4_NL:
      return QuantizeRowIQ4_NL(src, static_cast<BlockIQ4_NL*>(dst), n);
    case GgmlType::kIQ4_XS:
      return QuantizeRowIQ4_XS(src, static_cast<BlockIQ4_XS*>(dst), n);
    case GgmlType::kIQ2_XXS:
      return QuantizeRowIQ2_XXS(src, static_cast<BlockIQ2_XXS*>(dst), n);
    case GgmlType::kIQ3_XXS:
      return QuantizeRowIQ3_XXS(src, static_cast<BlockIQ3_XXS*>(dst), n);
    case GgmlType::kIQ2_XS:
      return QuantizeRowIQ2_XS(src, static_cast<BlockIQ2_XS*>(dst), n);
    case GgmlType::kIQ3_S:
      return QuantizeRowIQ3_S(src, static_cast<BlockIQ3_S*>(dst), n);
    case GgmlType::kIQ2_S:
      return QuantizeRowIQ2_S(src, static_cast<BlockIQ2_S*>(dst), n);
    case GgmlType::kIQ1_S:
      return QuantizeRowIQ1_S(src, static_cast<BlockIQ1_S*>(dst), n);
    default:
      break;
  }
  CHECK_MSG(false, "unsupported GgmlType");
}

void DequantizeRow(GgmlType type, const void* src, float* dst, int64_t n) {
  CHECK(IsRowSizeValid(type, n));
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      return ConvertF16ToF32(static_cast<const f16_bits*>(src), dst, n);
    case GgmlType::kBF16:
      return ConvertBF16ToF32(static_cast<const bf16_bits*>(src), dst, n);
    case GgmlType::kQ8_0:
      return DequantizeRowQ8_0(static_cast<const BlockQ8_0*>(src), dst, n);
    case GgmlType::kQ8_1:
      return DequantizeRowQ8_1(static_cast<const BlockQ8_1*>(src), dst, n);
    case GgmlType::kQ4_0:
      return DequantizeRowQ4_0(static_cast<const BlockQ4_0*>(src), dst, n);
    case GgmlType::kQ4_1:
      return DequantizeRowQ4_1(static_cast<const BlockQ4_1*>(src), dst, n);
    case GgmlType::kQ5_0:
      return DequantizeRowQ5_0(static_cast<const BlockQ5_0*>(src), dst, n);
    case GgmlType::kQ5_1:
      return DequantizeRowQ5_1(static_cast<const BlockQ5_1*>(src), dst, n);
    case GgmlType::kQ8_K:
      return DequantizeRowQ8_K(static_cast<const BlockQ8_K*>(src), dst, n);
    case GgmlType::kQ2_K:
      return DequantizeRowQ2_K(static_cast<const BlockQ2_K*>(src), dst, n);
    case GgmlType::kQ3_K:
      return DequantizeRowQ3_K(static_cast<const BlockQ3_K*>(src), dst, n);
    case GgmlType::kQ4_K:
      return DequantizeRowQ4_K(static_cast<const BlockQ4_K*>(src), dst, n);
    case GgmlType::kQ5_K:
      return DequantizeRowQ5_K(static_cast<const BlockQ5_K*>(src), dst, n);
    case GgmlType::kQ6_K:
      return DequantizeRowQ6_K(static_cast<const BlockQ6_K*>(src), dst, n);
    case GgmlType::kIQ4_NL:
      return DequantizeRowIQ4_NL(static_cast<const BlockIQ4_NL*>(src), dst, n);
    case GgmlType::kIQ4_XS:
      return DequantizeRowIQ4_XS(static_cast<const BlockIQ4_XS*>(src), dst, n);
    case GgmlType::kIQ2_XXS:
      return DequantizeRowIQ2_XXS(static_cast<const BlockIQ2_XXS*>(src), dst, n);
    case GgmlType::kIQ3_XXS:
      return DequantizeRowIQ3_XXS(static_cast<const BlockIQ3_XXS*>(src), dst, n);
    case GgmlType::kIQ2_XS:
      return DequantizeRowIQ2_XS(static_cast<const BlockIQ2_XS*>(src), dst, n);
    case GgmlType::kIQ3_S:
      return DequantizeRowIQ3_S(static_cast<const BlockIQ3_S*>(src), dst, n);
    case GgmlType::kIQ2_S:
      return DequantizeRowIQ2_S(static_cast<const BlockIQ2_S*>(src), dst, n);
    case GgmlType::kIQ1_S:
      return DequantizeRowIQ1_S(static_cast<const BlockIQ1_S*>(src), dst, n);
    default:
      break;
  }
  CHECK_MSG(false, "unsupported GgmlType");
}

float VecDot(GgmlType weight_type, const void* weight_row, const void* activation_row, int64_t n) {
  float out;
  VecDotRows(weight_type, weight_row, 1, activation_row, n, &out);
  return out;
}

namespace {

void DotRows(const quant_internal::RowKernels& k, GgmlType weight_type, const void* weight_rows, int64_t n_rows,
             const void* activation_row, int64_t n, float* out) {
  CHECK(IsRowSizeValid(weight_type, n));
  CHECK(n_rows >= 0);
  switch (weight_type) {
    case GgmlType::kF32:
      return k.f32(static_cast<const float*>(weight_rows), n_rows, static_cast<const float*>(activation_row), n, out);
    case GgmlType::kF16:
      return k.f16(static_cast<const f16_bits*>(weight_rows), n_rows, static_cast<const f16_bits*>(activation_row), n,
                   out);
    case GgmlType::kBF16:
      return k.bf16(static_cast<const bf16_bits*>(weight_rows), n_rows, static_cast<const bf16_bits*>(activation_row),
                    n, out);
    case GgmlType::kQ8_0:
      return k.q8_0(static_cast<const BlockQ8_0*>(weight_rows), n_rows, static_cast<const BlockQ8_0*>(activation_row),
                    n, out);
    case GgmlType::kQ4_0:
      return k.q4_0(static_cast<const BlockQ4_0*>(weight_rows), n_rows, static_cast<const BlockQ8_0*>(activation_row),
                    n, out);
    case GgmlType::kQ4_1:
      return k.q4_1(static_cast<const BlockQ4_1*>(weight_rows), n_rows, static_cast<const BlockQ8_1*>(activation_row),
                    n, out);
    case GgmlType::kQ5_0:
      return k.q5_0(static_cast<const BlockQ5_0*>(weight_rows), n_rows, static_cast<const BlockQ8_0*>(activation_row),
                    n, out);
    case GgmlType::kQ5_1:
      return k.q5_1(static_cast<const BlockQ5_1*>(weight_rows), n_rows, static_cast<const BlockQ8_1*>(activation_row),
                    n, out);
    case GgmlType::kQ2_K:
      return k.q2_k(static_cast<const BlockQ2_K*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                    n, out);
    case GgmlType::kQ3_K:
      return k.q3_k(static_cast<const BlockQ3_K*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                    n, out);
    case GgmlType::kQ4_K:
      return k.q4_k(static_cast<const BlockQ4_K*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                    n, out);
    case GgmlType::kQ5_K:
      return k.q5_k(static_cast<const BlockQ5_K*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                    n, out);
    case GgmlType::kQ6_K:
      return k.q6_k(static_cast<const BlockQ6_K*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                    n, out);
    case GgmlType::kIQ4_NL:
      return k.iq4_nl(static_cast<const BlockIQ4_NL*>(weight_rows), n_rows,
                      static_cast<const BlockQ8_0*>(activation_row), n, out);
    case GgmlType::kIQ4_XS:
      return k.iq4_xs(static_cast<const BlockIQ4_XS*>(weight_rows), n_rows,
                      static_cast<const BlockQ8_K*>(activation_row), n, out);
    case GgmlType::kIQ2_XXS:
      return k.iq2_xxs(static_cast<const BlockIQ2_XXS*>(weight_rows), n_rows,
                       static_cast<const BlockQ8_K*>(activation_row), n, out);
    case GgmlType::kIQ3_XXS:
      return k.iq3_xxs(static_cast<const BlockIQ3_XXS*>(weight_rows), n_rows,
                       static_cast<const BlockQ8_K*>(activation_row), n, out);
    case GgmlType::kIQ2_XS:
      return k.iq2_xs(static_cast<const BlockIQ2_XS*>(weight_rows), n_rows,
                      static_cast<const BlockQ8_K*>(activation_row), n, out);
    case GgmlType::kIQ3_S:
      return k.iq3_s(static_cast<const BlockIQ3_S*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                     n, out);
    case GgmlType::kIQ2_S:
      return k.iq2_s(static_cast<const BlockIQ2_S*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                     n, out);
    case GgmlType::kIQ1_S:
      return k.iq1_s(static_cast<const BlockIQ1_S*>(weight_rows), n_rows, static_cast<const BlockQ8_K*>(activation_row),
                     n, out);
    default:
      break;
  }
  CHECK_MSG(false, "not a weight type");
}

}  // namespace

void VecDotRows(GgmlType weight_type, const void* weight_rows, int64_t n_rows, const void* activation_row, int64_t n,
                float* out) {
  DotRows(quant_internal::ActiveRowKernels(), weight_type, weight_rows, n_rows, activation_row, n, out);
}

void VecDotRowsWith(KernelVariant v, GgmlType weight_type, const void* weight_rows, int64_t n_rows,
                    const void* activation_row, int64_t n, float* out) {
  CHECK_MSG(CpuSupports(v), "VecDotRowsWith: this CPU lacks the variant's features");
  DotRows(quant_internal::RowKernelsOf(v), weight_type, weight_rows, n_rows, activation_row, n, out);
}

const char* QuantKernelIsa() { return KernelVariantName(ActiveKernelVariant()); }

}  // namespace mer
