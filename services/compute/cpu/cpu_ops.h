// Element-wise and reduction ops of the qwen3moe graph on f32 rows, each written to round the way
// ggml's CPU backend does (noted per op), since parity with llama.cpp is the test of correctness.
#pragma once

#include <cmath>
#include <cstdint>

namespace mer::cpu {

// y = x / sqrt(mean(x^2) + eps) * w. ggml sums the squares in double and scales in f32, then
// multiplies by the weight as a separate op.
inline void RmsNorm(const float* x, const float* w, float eps, int64_t n, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

// In-place softmax of x[0, n) after x = x * scale (ggml_soft_max_ext without mask): exp of the
// shifted values in f32, their sum in double, then one f32 multiply by 1/sum.
inline void Softmax(float* x, int64_t n, float scale) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= scale;
    max = x[i] > max ? x[i] : max;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// cos/sin of NEOX RoPE for one position, as ggml's rope cache: theta starts at the position and is
// multiplied by base^(-2/n_dims) once per pair, in f32.
inline void RopeCache(int32_t position, float freq_base, int32_t n_dims, float* cos_out,
                      float* sin_out) {
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(n_dims));
  float theta = static_cast<float>(position);
  for (int32_t i = 0; i < n_dims / 2; ++i) {
    cos_out[i] = std::cos(theta);
    sin_out[i] = std::sin(theta);
    theta *= theta_scale;
  }
}

// NEOX rotation of one head in place: element i pairs with i + n_dims / 2.
inline void RopeNeox(float* x, int32_t n_dims, const float* cos_t, const float* sin_t) {
  const int32_t half = n_dims / 2;
  for (int32_t i = 0; i < half; ++i) {
    const float x0 = x[i];
    const float x1 = x[i + half];
    x[i] = x0 * cos_t[i] - x1 * sin_t[i];
    x[i + half] = x0 * sin_t[i] + x1 * cos_t[i];
  }
}

}  // namespace mer::cpu
