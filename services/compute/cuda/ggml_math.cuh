// Device copies of the lane arithmetic the CPU engine takes from ggml (services/compute/cpu/
// cpu_ops.h), operation for operation, so kernels that use them give the CPU's floats exactly.
#pragma once

#include <cstdint>

namespace mer::cuda {

// Element d of a NeoX-rotated head of 2 * half (cpu_ops.h RopeNeox as GCC compiles it, -mfma
// contracting): x0 = head[d mod half], x1 = head[d mod half + half], c / s that pair's cos / sin.
__device__ inline float RopeNeoxAt(int d, int half, float x0, float x1, float c, float s) {
  return d < half ? fmaf(x0, c, -__fmul_rn(x1, s)) : fmaf(x0, s, __fmul_rn(x1, c));
}

// One lane of ggml_v_expf (cpu_ops.h GgmlExpf).
__device__ inline float GgmlExpf(float x) {
  const float r = 0x1.8p23f;
  const float z = fmaf(x, 0x1.715476p+0f, r);
  const float n = __fsub_rn(z, r);
  const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
  if (n != n) return n;
  if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : __int_as_float(0x7f800000);
  const float u = __fmul_rn(b, b);
  const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                       fmaf(0x1.ffffecp-1f, b, 1.0f));
  return ldexpf(j, static_cast<int>(n));
}

// One element of ggml_vec_swiglu_f32 (cpu_ops.h SwiGlu), silu(gate) * up: the expert products'
// n_ff is a multiple of 16, so every element takes the vector form, never the scalar tail.
__device__ inline float SwiGlu(float gate, float up) {
  return __fmul_rn(__fdiv_rn(gate, __fadd_rn(1.0f, GgmlExpf(0.0f - gate))), up);
}

// glibc's expf, which the CPU engine (as ggml) uses past the last whole group of 16 of a softmax:
// glibc's is within 0.502 ulp, i.e. the correctly rounded float except for arguments whose exact
// value lies within 0.002 ulp of a rounding midpoint, and the double exp rounded to float is
// correctly rounded except within ~1e-9 ulp of one. The two agree outside that band, where
// CUDA's expf (2 ulp) often does not.
__device__ inline float GlibcExpf(float x) { return static_cast<float>(exp(static_cast<double>(x))); }

// _mm512_reduce_add_ps's order (cpu_ops.h ReduceAdd16).
__device__ inline float ReduceAdd16(const float* v) {
  float a[8], b[4];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = __fadd_rn(v[i + 8], v[i]);
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = __fadd_rn(a[i + 4], a[i]);
  return __fadd_rn(__fadd_rn(b[0], b[2]), __fadd_rn(b[1], b[3]));
}

// GGML_F32_VEC_REDUCE of 64 lanes (cpu_ops.h ReduceAcc64).
__device__ inline float ReduceAcc64(const float* s) {
  float v[16];
#pragma unroll
  for (int l = 0; l < 16; ++l) v[l] = __fadd_rn(__fadd_rn(s[l], s[32 + l]), __fadd_rn(s[16 + l], s[48 + l]));
  return ReduceAdd16(v);
}

// ggml_vec_dot_f32 by one thread (cpu_ops.h DotF32Ggml).
__device__ inline float DotF32Ggml(const float* x, const float* y, int64_t n) {
  float s[64];
#pragma unroll
  for (int l = 0; l < 64; ++l) s[l] = 0.0f;
  const int64_t np = n & ~int64_t{63};
  for (int64_t i = 0; i < np; i += 64) {
#pragma unroll
    for (int l = 0; l < 64; ++l) s[l] = fmaf(x[i + l], y[i + l], s[l]);
  }
  float sum = ReduceAcc64(s);
  for (int64_t i = np; i < n; ++i) sum = fmaf(x[i], y[i], sum);
  return sum;
}

// DotF32Ggml with 16-byte loads: x and y 16-byte aligned, n a multiple of 4. Same arithmetic.
__device__ inline float DotF32GgmlVec4(const float* x, const float* y, int64_t n) {
  float s[64];
#pragma unroll
  for (int l = 0; l < 64; ++l) s[l] = 0.0f;
  const int64_t np = n & ~int64_t{63};
  for (int64_t i = 0; i < np; i += 64) {
#pragma unroll
    for (int l4 = 0; l4 < 16; ++l4) {
      const float4 a = reinterpret_cast<const float4*>(x + i)[l4];
      const float4 b = reinterpret_cast<const float4*>(y + i)[l4];
      s[4 * l4 + 0] = fmaf(a.x, b.x, s[4 * l4 + 0]);
      s[4 * l4 + 1] = fmaf(a.y, b.y, s[4 * l4 + 1]);
      s[4 * l4 + 2] = fmaf(a.z, b.z, s[4 * l4 + 2]);
      s[4 * l4 + 3] = fmaf(a.w, b.w, s[4 * l4 + 3]);
    }
  }
  float sum = ReduceAcc64(s);
  for (int64_t i = np; i < n; ++i) sum = fmaf(x[i], y[i], sum);
  return sum;
}

}  // namespace mer::cuda
