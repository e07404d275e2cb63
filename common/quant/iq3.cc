#include "common/quant/iq3.h"

#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/grid_fit.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::MagnitudesAndSigns;
using quant_internal::OddScaleBlockScale;
using quant_internal::OddScaleCode;

constexpr int kQK = kKBlockSize;
constexpr int kSub = 32;  // elements per sub-block

inline int GridByte(int index, int i) { return (kIQ3_XXSGrid[index] >> (8 * i)) & 0xFF; }

// The grid's codes in memory order (byte i of an entry is code i).
const quant_internal::Grid& TheGrid() {
  static const quant_internal::Grid grid(reinterpret_cast<const uint8_t*>(kIQ3_XXSGrid), 256, 4,
                                         {4, 12, 20, 28, 36, 44, 52, 62});
  return grid;
}

void QuantizeBlock(const float* x, BlockIQ3_XXS* y) {
  float m[kQK];
  uint8_t signs[kQK / 8];
  MagnitudesAndSigns(x, m, signs, /*odd_ok=*/false);
  float scales[8];
  for (int j = 0; j < 8; ++j) scales[j] = TheGrid().FitScale(m + kSub * j, kSub);
  // Sub-block j's scale is d * (2 ls + 1) / 4 with ls in [0, 15].
  y->d = OddScaleBlockScale(scales, 8, 4.0f, 15);
  const float d = F16ToF32(y->d);
  for (int j = 0; j < 8; ++j) {
    const int ls = OddScaleCode(scales[j], d, 4.0f, 15);
    const float db = d * (0.5f + ls) * 0.5f;
    uint32_t word = static_cast<uint32_t>(ls) << 28;
    for (int l = 0; l < 4; ++l) {
      for (int h = 0; h < 2; ++h) {
        float unused;
        y->qs[8 * j + 2 * l + h] =
            static_cast<uint8_t>(db == 0.0f ? 0 : TheGrid().Map(m + kSub * j + 8 * l + 4 * h, db, &unused));
      }
      word |= static_cast<uint32_t>(signs[4 * j + l] & 127) << (7 * l);
    }
    std::memcpy(y->qs + 64 + 4 * j, &word, 4);
  }
}

// IQ3_S's grid, coded as IQ3_XXS's.
const quant_internal::Grid& SGrid() {
  static const quant_internal::Grid grid(reinterpret_cast<const uint8_t*>(kIQ3_SGrid), 512, 4,
                                         {1, 3, 5, 7, 9, 11, 13, 15});
  return grid;
}

inline int SGridByte(int index, int i) { return (kIQ3_SGrid[index] >> (8 * i)) & 0xFF; }

// IQ3_S's 9-bit grid index of the k-th 4 elements (k in [0, 8)) of sub-block j.
inline int SIndex(const BlockIQ3_S& x, int j, int k) { return x.qs[8 * j + k] | ((x.qh[j] >> k) & 1) << 8; }

// IQ3_S's scale code of sub-block j.
inline int SScale(const BlockIQ3_S& x, int j) { return (x.scales[j / 2] >> (4 * (j % 2))) & 0xF; }

void QuantizeBlock(const float* x, BlockIQ3_S* y) {
  *y = BlockIQ3_S{};
  float m[kQK];
  MagnitudesAndSigns(x, m, y->signs, /*odd_ok=*/true);
  float scales[8];
  for (int j = 0; j < 8; ++j) scales[j] = SGrid().FitScale(m + kSub * j, kSub);
  // Sub-block j's scale is d * (2 ls + 1) with ls in [0, 15].
  y->d = OddScaleBlockScale(scales, 8, 1.0f, 15);
  const float d = F16ToF32(y->d);
  for (int j = 0; j < 8; ++j) {
    const int ls = OddScaleCode(scales[j], d, 1.0f, 15);
    y->scales[j / 2] |= static_cast<uint8_t>(ls << (4 * (j % 2)));
    const float db = d * static_cast<float>(2 * ls + 1);
    for (int k = 0; k < 8; ++k) {
      float unused;
      const int g = db == 0.0f ? 0 : SGrid().Map(m + kSub * j + 4 * k, db, &unused);
      y->qs[8 * j + k] = static_cast<uint8_t>(g & 0xFF);
      y->qh[j] |= static_cast<uint8_t>((g >> 8) << k);
    }
  }
}

inline uint32_t Word(const BlockIQ3_XXS& x, int j) {
  uint32_t w;
  std::memcpy(&w, x.qs + 64 + 4 * j, 4);
  return w;
}

}  // namespace

void QuantizeRowIQ3_S(const float* src, BlockIQ3_S* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

// As ggml's dequantize_row_iq3_s: d * (1 + 2 ls), times the grid byte, times the sign.
void DequantizeRowIQ3_S(const BlockIQ3_S* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockIQ3_S& x = src[b];
    const float d = F16ToF32(x.d);
    for (int j = 0; j < 8; ++j) {
      const float db = d * static_cast<float>(1 + 2 * SScale(x, j));
      for (int e = 0; e < kSub; ++e) {
        const int code = SGridByte(SIndex(x, j, e / 4), e % 4);
        const bool negative = (x.signs[4 * j + e / 8] >> (e % 8)) & 1;
        dst[b * kQK + kSub * j + e] = db * static_cast<float>(code) * (negative ? -1.0f : 1.0f);
      }
    }
  }
}

void VecDotRowsIQ3_S(const BlockIQ3_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq3_s(rows, n_rows, a, n, out);
}

void VecDotRowsIQ3_SScalar(const BlockIQ3_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ3_S& x = rows[r * nb + b];
      int32_t sumi = 0;
      for (int j = 0; j < 8; ++j) {
        int32_t s = 0;
        for (int e = 0; e < kSub; ++e) {
          const int v = SGridByte(SIndex(x, j, e / 4), e % 4) * a[b].qs[kSub * j + e];
          s += (x.signs[4 * j + e / 8] >> (e % 8)) & 1 ? -v : v;
        }
        sumi += (2 * SScale(x, j) + 1) * s;
      }
      sum += F16ToF32(x.d) * a[b].d * static_cast<float>(sumi);
    }
    out[r] = sum;
  }
}

void QuantizeRowIQ3_XXS(const float* src, BlockIQ3_XXS* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

// As ggml's dequantize_row_iq3_xxs: d * (0.5 + ls) * 0.5, times the grid byte, times the sign.
void DequantizeRowIQ3_XXS(const BlockIQ3_XXS* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = Word(src[b], j);
      const float db = d * (0.5f + static_cast<float>(word >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = IQSignBits((word >> (7 * l)) & 127);
        for (int i = 0; i < 8; ++i) {
          const int g = src[b].qs[8 * j + 2 * l + i / 4];
          dst[b * kQK + kSub * j + 8 * l + i] =
              db * static_cast<float>(GridByte(g, i % 4)) * ((signs >> i) & 1 ? -1.0f : 1.0f);
        }
      }
    }
  }
}

void VecDotRowsIQ3_XXS(const BlockIQ3_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq3_xxs(rows, n_rows, a, n, out);
}

void VecDotRowsIQ3_XXSScalar(const BlockIQ3_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ3_XXS& x = rows[r * nb + b];
      int32_t sumi = 0;
      for (int j = 0; j < 8; ++j) {
        const uint32_t word = Word(x, j);
        int32_t s = 0;
        for (int l = 0; l < 4; ++l) {
          const uint8_t signs = IQSignBits((word >> (7 * l)) & 127);
          for (int i = 0; i < 8; ++i) {
            const int v = GridByte(x.qs[8 * j + 2 * l + i / 4], i % 4) * a[b].qs[kSub * j + 8 * l + i];
            s += (signs >> i) & 1 ? -v : v;
          }
        }
        sumi += static_cast<int32_t>(2 * (word >> 28) + 1) * s;
      }
      sum += F16ToF32(x.d) * a[b].d * static_cast<float>(sumi);
    }
    out[r] = 0.25f * sum;
  }
}

}  // namespace mer
