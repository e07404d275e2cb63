// The search the grid quantizers of common/quant share (IQ2_*, IQ3_*; internal): a group of
// `width` magnitudes mapped to one of a grid's points, and a sub-block's scale fit to the grid.
#pragma once

#include <cstdint>
#include <vector>

namespace mer::quant_internal {

// The magnitudes m[256] of a 256-element block and per group of 8 its signs (bit i: element i
// negative). Unless `odd_ok`, a group with an odd number of negatives has its smallest element's
// sign flipped, which costs least: IQ2_XXS, IQ2_XS and IQ3_XXS store 7 signs and their parity.
void MagnitudesAndSigns(const float* x, float* m, uint8_t* signs, bool odd_ok);

// A grid: `points` entries of `width` codes each (codes[width * g + i] is code i of point g),
// every code one of `levels` (ascending).
class Grid {
 public:
  Grid(const uint8_t* codes, int points, int width, std::vector<float> levels);

  int width() const { return width_; }
  int code(int g, int i) const { return codes_[width_ * g + i]; }

  // The point for magnitudes m[0..width) at `scale` units per code, and its squared error
  // (*err): the closest of the points nearest to the pattern of nearest levels and to the
  // patterns one level away from it in one element.
  int Map(const float* m, float scale, float* err) const;

  // A scale (units per code) for the n / width groups of m[0..n): trial scales around the one
  // mapping the largest magnitude to the top level, each followed by the least-squares scale of
  // the points it chose; the least squared error wins. 0 for all-zero magnitudes.
  float FitScale(const float* m, int n) const;

 private:
  const uint8_t* codes_;
  int points_, width_;
  std::vector<float> levels_;
  std::vector<uint16_t> nearest_;  // per pattern of levels (base levels_.size(), element 0 lowest)
};

}  // namespace mer::quant_internal
