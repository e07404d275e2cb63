#include "common/quant/iq2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/base/check.h"
#include "common/quant/row_kernels.h"
#include "common/quant/scale_fit.h"

namespace mer {
namespace {

using quant_internal::NearestInt;

constexpr int kQK = kKBlockSize;
constexpr int kSub = 32;                      // elements per sub-block
constexpr float kLevels[3] = {8, 25, 43};     // the grid's magnitude codes
constexpr int kPatterns = 3 * 3 * 3 * 3 * 3 * 3 * 3 * 3;  // a level per element of a group

inline int GridByte(int index, int i) { return (kIQ2_XXSGrid[index] >> (8 * i)) & 0xFF; }

// For every pattern of levels of a group (element i's level the i-th base-3 digit), the grid
// point nearest to it.
const std::vector<uint8_t>& NearestGridPoint() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(kPatterns);
    for (int p = 0; p < kPatterns; ++p) {
      float want[8];
      for (int i = 0, q = p; i < 8; ++i, q /= 3) want[i] = kLevels[q % 3];
      float best = INFINITY;
      for (int g = 0; g < 256; ++g) {
        float err = 0;
        for (int i = 0; i < 8; ++i) err += (want[i] - GridByte(g, i)) * (want[i] - GridByte(g, i));
        if (err < best) {
          best = err;
          t[p] = static_cast<uint8_t>(g);
        }
      }
    }
    return t;
  }();
  return table;
}

// The grid point for magnitudes m[0..8) at `scale` units per grid code, and its squared error:
// the best of the points nearest to the pattern of nearest levels and to the 16 patterns one
// level away from it in one element.
int MapGroup(const float* m, float scale, float* err) {
  int pattern = 0, levels[8];
  for (int i = 7; i >= 0; --i) {
    const float v = m[i] / scale;
    levels[i] = v < (kLevels[0] + kLevels[1]) / 2 ? 0 : v < (kLevels[1] + kLevels[2]) / 2 ? 1 : 2;
    pattern = 3 * pattern + levels[i];
  }
  const auto error = [&](int g) {
    float e = 0;
    for (int i = 0; i < 8; ++i) {
      const float diff = m[i] - scale * GridByte(g, i);
      e += diff * diff;
    }
    return e;
  };
  int best = NearestGridPoint()[pattern];
  *err = error(best);
  for (int i = 0, power = 1; i < 8; ++i, power *= 3) {
    for (int delta : {-1, 1}) {
      if (levels[i] + delta < 0 || levels[i] + delta > 2) continue;
      const int g = NearestGridPoint()[pattern + delta * power];
      const float e = error(g);
      if (e < *err) {
        *err = e;
        best = g;
      }
    }
  }
  return best;
}

// A sub-block's scale (units per grid code): trial scales around the one mapping the largest
// magnitude to 43, each followed by the least-squares scale for the grid points it chose.
float FitSubBlock(const float* m) {
  const float max = *std::max_element(m, m + kSub);
  if (max < 1e-15f) return 0.0f;
  float best_err = INFINITY, best = 0;
  for (int step = 0; step <= 8; ++step) {
    const float trial = max / 43.0f * (0.6f + 0.05f * step);
    float sum_mg = 0, sum_gg = 0;
    int grid[4];
    for (int l = 0; l < 4; ++l) {
      float unused;
      grid[l] = MapGroup(m + 8 * l, trial, &unused);
      for (int i = 0; i < 8; ++i) {
        sum_mg += m[8 * l + i] * GridByte(grid[l], i);
        sum_gg += static_cast<float>(GridByte(grid[l], i) * GridByte(grid[l], i));
      }
    }
    const float scale = sum_mg / sum_gg;
    float err = 0;
    for (int l = 0; l < 4; ++l) {
      for (int i = 0; i < 8; ++i) {
        const float diff = m[8 * l + i] - scale * GridByte(grid[l], i);
        err += diff * diff;
      }
    }
    if (err < best_err) {
      best_err = err;
      best = scale;
    }
  }
  return best;
}

void QuantizeBlock(const float* x, BlockIQ2_XXS* y) {
  float m[kQK];
  uint8_t signs[kQK / 8];  // per group, bit i = element i negative
  for (int g = 0; g < kQK / 8; ++g) {
    int mask = 0, smallest = 0;
    for (int i = 0; i < 8; ++i) {
      const float v = x[8 * g + i];
      m[8 * g + i] = std::fabs(v);
      if (v < 0) mask |= 1 << i;
      if (m[8 * g + i] < m[8 * g + smallest]) smallest = i;
    }
    // An odd number of negatives cannot be stored: flip the sign that costs least.
    if (__builtin_popcount(static_cast<unsigned>(mask)) & 1) mask ^= 1 << smallest;
    signs[g] = static_cast<uint8_t>(mask);
  }
  float scales[8];
  for (int j = 0; j < 8; ++j) scales[j] = FitSubBlock(m + kSub * j);
  const float max_scale = *std::max_element(scales, scales + 8);
  // Sub-block j's scale is d * (2 ls + 1) / 8 with ls in [0, 15]: the largest gets ls = 15.
  y->d = F32ToF16(max_scale * 8.0f / 31.0f);
  const float d = F16ToF32(y->d);
  for (int j = 0; j < 8; ++j) {
    const int ls = d == 0.0f ? 0 : std::clamp(NearestInt((8.0f * scales[j] / d - 1.0f) / 2.0f), 0, 15);
    const float db = d * (0.5f + ls) * 0.25f;
    uint32_t a0 = 0, a1 = static_cast<uint32_t>(ls) << 28;
    for (int l = 0; l < 4; ++l) {
      float unused;
      const int g = db == 0.0f ? 0 : MapGroup(m + kSub * j + 8 * l, db, &unused);
      a0 |= static_cast<uint32_t>(g) << (8 * l);
      a1 |= static_cast<uint32_t>(signs[4 * j + l] & 127) << (7 * l);
    }
    std::memcpy(y->qs + 4 * j, &a0, 4);
    std::memcpy(y->qs + 4 * j + 2, &a1, 4);
  }
}

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
        const int g = (a0 >> (8 * l)) & 0xFF;
        const uint8_t signs = IQ2SignMask((a1 >> (7 * l)) & 127);
        for (int i = 0; i < 8; ++i) {
          dst[b * kQK + kSub * j + 8 * l + i] =
              db * static_cast<float>(GridByte(g, i)) * ((signs >> i) & 1 ? -1.0f : 1.0f);
        }
      }
    }
  }
}

void VecDotRowsIQ2_XXS(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                       float* out) {
  CHECK(n % kQK == 0);
  quant_internal::ActiveRowKernels().iq2_xxs(rows, n_rows, a, n, out);
}

void VecDotRowsIQ2_XXSScalar(const BlockIQ2_XXS* rows, int64_t n_rows, const BlockQ8_K* a,
                             int64_t n, float* out) {
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
          const int g = (a0 >> (8 * l)) & 0xFF;
          const uint8_t signs = IQ2SignMask((a1 >> (7 * l)) & 127);
          for (int i = 0; i < 8; ++i) {
            const int v = GridByte(g, i) * a[b].qs[kSub * j + 8 * l + i];
            s += (signs >> i) & 1 ? -v : v;
          }
        }
        sumi += static_cast<int32_t>(2 * (a1 >> 28) + 1) * s;
      }
      sum += F16ToF32(x.d) * a[b].d * static_cast<float>(sumi);
    }
    out[r] = 0.125f * sum;
  }
}

}  // namespace mer
