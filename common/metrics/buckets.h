// Histogram bucket boundaries of the daemons' metrics.
#pragma once

#include <vector>

namespace mer {

// n upper bounds start, start * factor, ..., start * factor^(n - 1) (prometheus-cpp's
// Histogram::BucketBoundaries is a std::vector<double>).
inline std::vector<double> ExponentialBuckets(double start, double factor, int n) {
  std::vector<double> b;
  for (int i = 0; i < n; ++i, start *= factor) b.push_back(start);
  return b;
}

}  // namespace mer
