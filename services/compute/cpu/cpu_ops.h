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

// llama.cpp's CPU backend (the AVX-512 build ggml picks on AVX-512 hosts, as the reference does)
// computes these with SIMD code whose rounding differs from the plain scalar loops by an ulp here
// and there; an ulp can flip a later Q8_0 rounding and show up as a ~0.05 logit jump many steps
// later. So the helpers below reproduce ggml's lane arithmetic exactly, one lane at a time.

// One lane of ggml_v_expf (vec.h): the fma-based range reduction and polynomial, then scalef.
inline float GgmlExpf(float x) {
  const float r = 0x1.8p23f;
  const float z = std::fma(x, 0x1.715476p+0f, r);
  const float n = z - r;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  if (n != n) return n;  // NaN in, NaN out (scalef of NaN)
  if (std::fabs(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
  const float u = b * b;
  const float j =
      std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
               std::fma(0x1.ffffecp-1f, b, 1.0f));
  return std::ldexp(j, static_cast<int>(n));  // scalef: exact scaling by 2^n
}

// _mm512_reduce_add_ps as GCC expands it: halves added pairwise (lane i + lane i+8, then i + i+4,
// then i + i+2), then lane 0 + lane 1.
inline float ReduceAdd16(const float* v) {
  float a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = v[i + 8] + v[i];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  const float c0 = b[0] + b[2], c1 = b[1] + b[3];
  return c0 + c1;
}

// GGML_F32_VEC_REDUCE of the 4 x 16 accumulators of ggml_vec_dot_f32 (s[16 * k + lane]):
// acc0 += acc2, acc1 += acc3, acc0 += acc1, then ReduceAdd16.
inline float ReduceAcc64(const float* s) {
  float v[16];
  for (int l = 0; l < 16; ++l) v[l] = (s[l] + s[32 + l]) + (s[16 + l] + s[48 + l]);
  return ReduceAdd16(v);
}

// ggml_vec_dot_f32 (AVX-512): 4 accumulators of 16 lanes, element i in accumulator lane i % 64,
// fused multiply-add; reduced as above; the tail past the last multiple of 64 added in f32.
// ggml uses it for F32 x F32 mat-muls of one src1 column or a non-contiguous src1 (K.q), and in
// mul_mat_id.
inline float DotF32Ggml(const float* x, const float* y, int64_t n) {
  float s[64] = {};
  const int64_t np = n & ~int64_t{63};
  for (int64_t i = 0; i < np; i += 64)
    for (int l = 0; l < 64; ++l) s[l] = std::fma(x[i + l], y[i + l], s[l]);
  float sum = ReduceAcc64(s);
  for (int64_t i = np; i < n; ++i) sum = std::fma(x[i], y[i], sum);
  return sum;
}

// In-place softmax of x[0, n) after x = x * scale, as ggml_soft_max_ext / ggml_vec_soft_max_f32
// (AVX-512): the exps of the first floor(n_total / 16) * 16 entries by GgmlExpf, 16 at a time, each
// group summed in f32 by ReduceAdd16 and added to a double; the rest by expf, added one by one;
// then one f32 multiply by (float)(1 / sum). n_total >= n counts masked (-inf) entries after x[n):
// llama.cpp runs attention over the whole padded KV window (a multiple of 256 cells), whose masked
// cells contribute exact zeros, so attention passes n_total = n rounded up to 16.
inline void Softmax(float* x, int64_t n, float scale, int64_t n_total) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    x[i] *= scale;
    max = x[i] > max ? x[i] : max;
  }
  double sum = 0.0;
  int64_t i = 0;
  for (; i + 16 <= n_total; i += 16) {
    float v[16];
    for (int l = 0; l < 16; ++l) {
      const int64_t k = i + l;
      v[l] = k < n ? GgmlExpf(x[k] - max) : 0.0f;
      if (k < n) x[k] = v[l];
    }
    sum += static_cast<double>(ReduceAdd16(v));
  }
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t k = 0; k < n; ++k) x[k] *= inv;
}

inline void Softmax(float* x, int64_t n, float scale) { Softmax(x, n, scale, n); }

// ggml_vec_swiglu_f32 (AVX-512): silu(x) * g with ggml_v_silu, x / (1 + GgmlExpf(-x)), in groups
// of 16; the tail by ggml_silu_f32, x / (1 + expf(-x)).
inline void SwiGlu(float* x, const float* g, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) x[i + l] = (x[i + l] / (1.0f + GgmlExpf(0.0f - x[i + l]))) * g[i + l];
  for (; i < n; ++i) x[i] = (x[i] / (1.0f + std::exp(-x[i]))) * g[i];
}

// cos/sin of NEOX RoPE for one position, as ggml's rope cache: theta starts at the position and is
// multiplied by base^(-2/n_dims) once per pair, in f32.
inline void RopeCache(int32_t position, float freq_base, int32_t n_dims, float* cos_out, float* sin_out) {
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
