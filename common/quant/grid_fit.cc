#include "common/quant/grid_fit.h"

#include <algorithm>
#include <cmath>

#include "common/base/check.h"
#include "common/quant/blocks.h"

namespace mer::quant_internal {

void MagnitudesAndSigns(const float* x, float* m, uint8_t* signs, bool odd_ok) {
  for (int g = 0; g < kKBlockSize / 8; ++g) {
    int mask = 0, smallest = 0;
    for (int i = 0; i < 8; ++i) {
      const float v = x[8 * g + i];
      m[8 * g + i] = std::fabs(v);
      if (v < 0) mask |= 1 << i;
      if (m[8 * g + i] < m[8 * g + smallest]) smallest = i;
    }
    if (!odd_ok && __builtin_popcount(static_cast<unsigned>(mask)) & 1) mask ^= 1 << smallest;
    signs[g] = static_cast<uint8_t>(mask);
  }
}

Grid::Grid(const uint8_t* codes, int points, int width, std::vector<float> levels)
    : codes_(codes), points_(points), width_(width), levels_(std::move(levels)) {
  const int n_levels = static_cast<int>(levels_.size());
  int patterns = 1;
  for (int i = 0; i < width_; ++i) patterns *= n_levels;
  CHECK(patterns <= (1 << 16) && points_ <= (1 << 16));
  nearest_.resize(patterns);
  std::vector<float> want(width_);
  for (int p = 0; p < patterns; ++p) {
    for (int i = 0, q = p; i < width_; ++i, q /= n_levels) want[i] = levels_[q % n_levels];
    float best = INFINITY;
    for (int g = 0; g < points_; ++g) {
      float err = 0;
      for (int i = 0; i < width_; ++i) err += (want[i] - code(g, i)) * (want[i] - code(g, i));
      if (err < best) {
        best = err;
        nearest_[p] = static_cast<uint16_t>(g);
      }
    }
  }
}

int Grid::Map(const float* m, float scale, float* err) const {
  const int n_levels = static_cast<int>(levels_.size());
  int pattern = 0, level[16];
  for (int i = width_ - 1; i >= 0; --i) {
    const float v = m[i] / scale;
    level[i] = 0;
    while (level[i] + 1 < n_levels && v >= (levels_[level[i]] + levels_[level[i] + 1]) / 2) ++level[i];
    pattern = n_levels * pattern + level[i];
  }
  const auto error = [&](int g) {
    float e = 0;
    for (int i = 0; i < width_; ++i) {
      const float diff = m[i] - scale * code(g, i);
      e += diff * diff;
    }
    return e;
  };
  int best = nearest_[pattern];
  *err = error(best);
  for (int i = 0, power = 1; i < width_; ++i, power *= n_levels) {
    for (int delta : {-1, 1}) {
      if (level[i] + delta < 0 || level[i] + delta >= n_levels) continue;
      const int g = nearest_[pattern + delta * power];
      const float e = error(g);
      if (e < *err) {
        *err = e;
        best = g;
      }
    }
  }
  return best;
}

float Grid::FitScale(const float* m, int n) const {
  const float max = *std::max_element(m, m + n);
  if (max < 1e-15f) return 0.0f;
  float best_err = INFINITY, best = 0;
  std::vector<int> points(n / width_);
  for (int step = 0; step <= 8; ++step) {
    const float trial = max / levels_.back() * (0.6f + 0.05f * step);
    float sum_mg = 0, sum_gg = 0;
    for (int l = 0; l < n / width_; ++l) {
      float unused;
      points[l] = Map(m + width_ * l, trial, &unused);
      for (int i = 0; i < width_; ++i) {
        sum_mg += m[width_ * l + i] * code(points[l], i);
        sum_gg += static_cast<float>(code(points[l], i) * code(points[l], i));
      }
    }
    const float scale = sum_mg / sum_gg;
    float err = 0;
    for (int l = 0; l < n / width_; ++l) {
      for (int i = 0; i < width_; ++i) {
        const float diff = m[width_ * l + i] - scale * code(points[l], i);
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

}  // namespace mer::quant_internal
