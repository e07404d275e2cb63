#include "common/quant/iq1.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/check.h"
#include "common/quant/grid_fit.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::OddScaleBlockScale;
using quant_internal::OddScaleCode;

constexpr int kQK = kKBlockSize;
constexpr int kSub = 32;  // elements per sub-block

inline int GridValue(int index, int i) { return static_cast<int8_t>((kIQ1_SGrid[index] >> (8 * i)) & 0xFF); }

// Group g's 11-bit grid index.
inline int Index(const BlockIQ1_S& x, int g) { return x.qs[g] | ((x.qh[g / 4] >> (3 * (g % 4))) & 7) << 8; }

// The grid's values plus 1 (0, 1, 2): the unsigned codes grid_fit.h searches.
const quant_internal::Grid& ShiftedGrid() {
  static const std::vector<uint8_t> codes = [] {
    std::vector<uint8_t> c(2048 * 8);
    for (int g = 0; g < 2048; ++g) {
      for (int i = 0; i < 8; ++i) c[8 * g + i] = static_cast<uint8_t>(GridValue(g, i) + 1);
    }
    return c;
  }();
  static const quant_internal::Grid grid(codes.data(), 2048, 8, {0, 1, 2});
  return grid;
}

// The grid points of a sub-block's 4 groups at scale dl and offset delta, and their squared
// error: x ~ dl * (v + delta) is x + dl * (1 - delta) ~ dl * (v + 1), the shifted grid at scale dl.
float MapSubBlock(const float* x, float dl, float delta, int points[4]) {
  float err = 0;
  for (int l = 0; l < 4; ++l) {
    float shifted[8];
    for (int i = 0; i < 8; ++i) shifted[i] = x[8 * l + i] + dl * (1.0f - delta);
    float e;
    points[l] = ShiftedGrid().Map(shifted, dl, &e);
    err += e;
  }
  return err;
}

struct SubBlockFit {
  float scale;
  bool negative;  // the offset's sign
};

// Trial scales from 0.3 to 1.1 times the largest magnitude, for either sign of the offset, each
// followed by the least-squares scale of the points it chose; the least squared error wins.
SubBlockFit FitSubBlock(const float* x) {
  float max = 0;
  for (int i = 0; i < kSub; ++i) max = std::max(max, std::fabs(x[i]));
  SubBlockFit best{0.0f, false};
  if (max < 1e-15f) return best;
  float best_err = INFINITY;
  for (bool negative : {false, true}) {
    const float delta = negative ? -kIQ1_SDelta : kIQ1_SDelta;
    for (int step = 0; step <= 16; ++step) {
      int points[4];
      MapSubBlock(x, max * (0.3f + 0.05f * step), delta, points);
      float sum_xv = 0, sum_vv = 0;
      for (int e = 0; e < kSub; ++e) {
        const float v = static_cast<float>(GridValue(points[e / 8], e % 8)) + delta;
        sum_xv += x[e] * v;
        sum_vv += v * v;
      }
      const float scale = sum_xv / sum_vv;
      if (!(scale > 0)) continue;
      float err = 0;
      for (int e = 0; e < kSub; ++e) {
        const float diff = x[e] - scale * (static_cast<float>(GridValue(points[e / 8], e % 8)) + delta);
        err += diff * diff;
      }
      if (err < best_err) {
        best_err = err;
        best = {scale, negative};
      }
    }
  }
  return best;
}

void QuantizeBlock(const float* x, BlockIQ1_S* y) {
  *y = BlockIQ1_S{};
  float scales[8];
  for (int j = 0; j < 8; ++j) scales[j] = FitSubBlock(x + kSub * j).scale;
  // Sub-block j's scale is d * (2 ls + 1) with ls in [0, 7].
  y->d = OddScaleBlockScale(scales, 8, 1.0f, 7);
  const float d = F16ToF32(y->d);
  for (int j = 0; j < 8; ++j) {
    const int ls = OddScaleCode(scales[j], d, 1.0f, 7);
    const float dl = d * static_cast<float>(2 * ls + 1);
    int qh = ls << 12;
    if (dl > 0.0f) {
      int points[2][4];
      const float err_positive = MapSubBlock(x + kSub * j, dl, kIQ1_SDelta, points[0]);
      const float err_negative = MapSubBlock(x + kSub * j, dl, -kIQ1_SDelta, points[1]);
      const int s = err_negative < err_positive ? 1 : 0;
      if (s == 1) qh |= 0x8000;
      for (int l = 0; l < 4; ++l) {
        y->qs[4 * j + l] = static_cast<uint8_t>(points[s][l] & 0xFF);
        qh |= (points[s][l] >> 8) << (3 * l);
      }
    }
    y->qh[j] = static_cast<uint16_t>(qh);
  }
}

}  // namespace

void QuantizeRowIQ1_S(const float* src, BlockIQ1_S* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

// As ggml's dequantize_row_iq1_s: d * (2 ls + 1), times the grid value plus the offset.
void DequantizeRowIQ1_S(const BlockIQ1_S* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockIQ1_S& x = src[b];
    const float d = F16ToF32(x.d);
    for (int j = 0; j < 8; ++j) {
      const float dl = d * static_cast<float>(2 * ((x.qh[j] >> 12) & 7) + 1);
      const float delta = x.qh[j] & 0x8000 ? -kIQ1_SDelta : kIQ1_SDelta;
      for (int e = 0; e < kSub; ++e) {
        dst[b * kQK + kSub * j + e] = dl * (static_cast<float>(GridValue(Index(x, 4 * j + e / 8), e % 8)) + delta);
      }
    }
  }
}

void VecDotRowsIQ1_S(const BlockIQ1_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq1_s(rows, n_rows, a, n, out);
}

void VecDotRowsIQ1_SScalar(const BlockIQ1_S* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockIQ1_S& x = rows[r * nb + b];
      int32_t sumi = 0, sum_offsets = 0;
      for (int j = 0; j < 8; ++j) {
        const int ls = 2 * ((x.qh[j] >> 12) & 7) + 1;
        int32_t s = 0;
        for (int e = 0; e < kSub; ++e) s += GridValue(Index(x, 4 * j + e / 8), e % 8) * a[b].qs[kSub * j + e];
        sumi += ls * s;
        const int32_t sum_a = a[b].bsums[2 * j] + a[b].bsums[2 * j + 1];
        sum_offsets += (x.qh[j] & 0x8000 ? -ls : ls) * sum_a;
      }
      sum += F16ToF32(x.d) * a[b].d * (static_cast<float>(sumi) + kIQ1_SDelta * static_cast<float>(sum_offsets));
    }
    out[r] = sum;
  }
}

}  // namespace mer
