#include "common/quant/iq2.h"

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

// A group of 8 elements: grid byte i of `point` (a grid's entry), negated where bit i of `signs`
// is set, times db; and its dot product with 8 activations. The three formats differ only in where
// they keep a group's grid index, signs and scale.
inline void DequantizeGroup(uint64_t point, uint8_t signs, float db, float* y) {
  for (int i = 0; i < 8; ++i) {
    y[i] = db * static_cast<float>((point >> (8 * i)) & 0xFF) * ((signs >> i) & 1 ? -1.0f : 1.0f);
  }
}
inline int32_t GroupDot(uint64_t point, uint8_t signs, const int8_t* a) {
  int32_t s = 0;
  for (int i = 0; i < 8; ++i) {
    const int v = static_cast<int>((point >> (8 * i)) & 0xFF) * a[i];
    s += (signs >> i) & 1 ? -v : v;
  }
  return s;
}

// The grids' codes in memory order (byte i of an entry is code i).
const quant_internal::Grid& XxsGrid() {
  static const quant_internal::Grid grid(reinterpret_cast<const uint8_t*>(kIQ2_XXSGrid), 256, 8, {8, 25, 43});
  return grid;
}
const quant_internal::Grid& XsGrid() {
  static const quant_internal::Grid grid(reinterpret_cast<const uint8_t*>(kIQ2_XSGrid), 512, 8, {8, 25, 43});
  return grid;
}

const quant_internal::Grid& SGrid() {
  static const quant_internal::Grid grid(reinterpret_cast<const uint8_t*>(kIQ2_SGrid), 1024, 8, {8, 25, 43});
  return grid;
}

void QuantizeBlock(const float* x, BlockIQ2_XXS* y) {
  float m[kQK];
  uint8_t signs[kQK / 8];
  MagnitudesAndSigns(x, m, signs, /*odd_ok=*/false);
  float scales[8];
  for (int j = 0; j < 8; ++j) scales[j] = XxsGrid().FitScale(m + kSub * j, kSub);
  // Sub-block j's scale is d * (2 ls + 1) / 8 with ls in [0, 15].
  y->d = OddScaleBlockScale(scales, 8, 8.0f, 15);
  const float d = F16ToF32(y->d);
  for (int j = 0; j < 8; ++j) {
    const int ls = OddScaleCode(scales[j], d, 8.0f, 15);
    const float db = d * (0.5f + ls) * 0.25f;
    uint32_t a0 = 0, a1 = static_cast<uint32_t>(ls) << 28;
    for (int l = 0; l < 4; ++l) {
      float unused;
      const int g = db == 0.0f ? 0 : XxsGrid().Map(m + kSub * j + 8 * l, db, &unused);
      a0 |= static_cast<uint32_t>(g) << (8 * l);
      a1 |= static_cast<uint32_t>(signs[4 * j + l] & 127) << (7 * l);
    }
    std::memcpy(y->qs + 4 * j, &a0, 4);
    std::memcpy(y->qs + 4 * j + 2, &a1, 4);
  }
}

void QuantizeBlock(const float* x, BlockIQ2_XS* y) {
  float m[kQK];
  uint8_t signs[kQK / 8];
  MagnitudesAndSigns(x, m, signs, /*odd_ok=*/false);
  float scales[16];  // per 16 elements
  for (int h = 0; h < 16; ++h) scales[h] = XsGrid().FitScale(m + 16 * h, 16);
  y->d = OddScaleBlockScale(scales, 16, 8.0f, 15);
  const float d = F16ToF32(y->d);
  for (int h = 0; h < 16; ++h) {
    const int ls = OddScaleCode(scales[h], d, 8.0f, 15);
    if (h % 2 == 0)
      y->scales[h / 2] = static_cast<uint8_t>(ls);
    else
      y->scales[h / 2] |= static_cast<uint8_t>(ls << 4);
    const float db = d * (0.5f + ls) * 0.25f;
    for (int l = 0; l < 2; ++l) {
      const int group = 2 * h + l;
      float unused;
      const int g = db == 0.0f ? 0 : XsGrid().Map(m + 8 * group, db, &unused);
      y->qs[group] = static_cast<uint16_t>(g | (signs[group] & 127) << 9);
    }
  }
}

void QuantizeBlock(const float* x, BlockIQ2_S* y) {
  *y = BlockIQ2_S{};
  float m[kQK];
  MagnitudesAndSigns(x, m, y->qs + kQK / 8, /*odd_ok=*/true);
  float scales[16];  // per 16 elements
  for (int h = 0; h < 16; ++h) scales[h] = SGrid().FitScale(m + 16 * h, 16);
  y->d = OddScaleBlockScale(scales, 16, 8.0f, 15);
  const float d = F16ToF32(y->d);
  for (int h = 0; h < 16; ++h) {
    const int ls = OddScaleCode(scales[h], d, 8.0f, 15);
    y->scales[h / 2] |= static_cast<uint8_t>(ls << (4 * (h % 2)));
    const float db = d * (0.5f + ls) * 0.25f;
    for (int l = 0; l < 2; ++l) {
      const int group = 2 * h + l;
      float unused;
      const int g = db == 0.0f ? 0 : SGrid().Map(m + 8 * group, db, &unused);
      y->qs[group] = static_cast<uint8_t>(g & 0xFF);
      y->qh[group / 4] |= static_cast<uint8_t>((g >> 8) << (2 * (group % 4)));
    }
  }
}

// IQ2_S's 10-bit grid index of group g.
inline int SIndex(const BlockIQ2_S& x, int g) { return x.qs[g] | ((x.qh[g / 4] >> (2 * (g % 4))) & 3) << 8; }
// The scale code of group g of IQ2_XS or IQ2_S, whose scales are packed alike (a code per 16).
inline int GroupScale(const uint8_t* scales, int g) { return (scales[g / 4] >> (4 * ((g / 2) % 2))) & 0xF; }

// Sub-block j's two words.
inline void Words(const BlockIQ2_XXS& x, int j, uint32_t* a0, uint32_t* a1) {
  std::memcpy(a0, x.qs + 4 * j, 4);
  std::memcpy(a1, x.qs + 4 * j + 2, 4);
}

}  // namespace

void QuantizeRowIQ2_XXS(const float* src, BlockIQ2_XXS* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void QuantizeRowIQ2_XS(const float* src, BlockIQ2_XS* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void QuantizeRowIQ2_S(const float* src, BlockIQ2_S* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

// As ggml's dequantize_row_iq2_s: IQ2_XS's with 8 sign bits per group.
void DequantizeRowIQ2_S(const BlockIQ2_S* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockIQ2_S& x = src[b];
    const float d = F16ToF32(x.d);
    for (int group = 0; group < kQK / 8; ++group) {
      const float db = d * (0.5f + static_cast<float>(GroupScale(x.scales, group))) * 0.25f;
      DequantizeGroup(kIQ2_SGrid[SIndex(x, group)], x.qs[kQK / 8 + group], db, dst + b * kQK + 8 * group);
    }
  }
}

void VecDotRowsIQ2_S(const BlockIQ2_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq2_s(rows, n_rows, a, n, out);
}

void VecDotRowsIQ2_SScalar(const BlockIQ2_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ2_S& x = rows[r * nb + b];
      int32_t sumi = 0;
      for (int group = 0; group < kQK / 8; ++group) {
        const int32_t s = GroupDot(kIQ2_SGrid[SIndex(x, group)], x.qs[kQK / 8 + group], a[b].qs + 8 * group);
        sumi += (2 * GroupScale(x.scales, group) + 1) * s;
      }
      sum += F16ToF32(x.d) * a[b].d * static_cast<float>(sumi);
    }
    out[r] = 0.125f * sum;
  }
}

// As ggml's dequantize_row_iq2_xs: IQ2_XXS's with the scale of each half sub-block.
void DequantizeRowIQ2_XS(const BlockIQ2_XS* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int group = 0; group < kQK / 8; ++group) {
      const float db = d * (0.5f + static_cast<float>(GroupScale(src[b].scales, group))) * 0.25f;
      const uint16_t q = src[b].qs[group];
      DequantizeGroup(kIQ2_XSGrid[q & 511], IQSignBits(q >> 9), db, dst + b * kQK + 8 * group);
    }
  }
}

void VecDotRowsIQ2_XS(const BlockIQ2_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq2_xs(rows, n_rows, a, n, out);
}

void VecDotRowsIQ2_XSScalar(const BlockIQ2_XS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ2_XS& x = rows[r * nb + b];
      int32_t sumi = 0;
      for (int group = 0; group < kQK / 8; ++group) {
        const int32_t s = GroupDot(kIQ2_XSGrid[x.qs[group] & 511], IQSignBits(x.qs[group] >> 9), a[b].qs + 8 * group);
        sumi += (2 * GroupScale(x.scales, group) + 1) * s;
      }
      sum += F16ToF32(x.d) * a[b].d * static_cast<float>(sumi);
    }
    out[r] = 0.125f * sum;
  }
}

// As ggml's dequantize_row_iq2_xxs: d * (0.5 + ls) * 0.25, times the grid byte, times the sign.
void DequantizeRowIQ2_XXS(const BlockIQ2_XXS* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float d = F16ToF32(src[b].d);
    for (int j = 0; j < 8; ++j) {
      uint32_t a0, a1;
      Words(src[b], j, &a0, &a1);
      const float db = d * (0.5f + static_cast<float>(a1 >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l) {
        DequantizeGroup(kIQ2_XXSGrid[(a0 >> (8 * l)) & 0xFF], IQSignBits((a1 >> (7 * l)) & 127), db,
                        dst + b * kQK + kSub * j + 8 * l);
      }
    }
  }
}

void VecDotRowsIQ2_XXS(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq2_xxs(rows, n_rows, a, n, out);
}

void VecDotRowsIQ2_XXSScalar(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ2_XXS& x = rows[r * nb + b];
      int32_t sumi = 0;
      for (int j = 0; j < 8; ++j) {
        uint32_t a0, a1;
        Words(x, j, &a0, &a1);
        int32_t s = 0;
        for (int l = 0; l < 4; ++l) {
          s += GroupDot(kIQ2_XXSGrid[(a0 >> (8 * l)) & 0xFF], IQSignBits((a1 >> (7 * l)) & 127),
                        a[b].qs + kSub * j + 8 * l);
        }
        sumi += static_cast<int32_t>(2 * (a1 >> 28) + 1) * s;
      }
      sum += F16ToF32(x.d) * a[b].d * static_cast<float>(sumi);
    }
    out[r] = 0.125f * sum;
  }
}

}  // namespace mer
