// The inner loop shared by every matrix product of the cuda backend (dense mat-vec, grouped
// experts): one warp computes R weight rows against NT activation rows. Decode is bandwidth-bound,
// so each weight byte is read once per call with 16-byte loads (streaming, evict-first), the R rows
// give R independent loads in flight per lane, and the NT activation rows (small, cache-resident)
// reuse each loaded weight chunk. Sizes: cols a multiple of 32 (CHECKed at engine creation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/act_store.cuh"

namespace mer::cuda {

// Elements in one 16-byte chunk of a weight row.
template <int kType>
constexpr int kElemsPerChunk = kType == kDevF32 ? 4 : (kType == kDevQ8_0 ? 16 : 8);

// Row r of matrix m: quants (or values) and, for Q8_0, the block scales.
struct RowRef {
  const uint8_t* q = nullptr;
  const __half* s = nullptr;
};

template <int kType>
__device__ inline RowRef MatrixRow(const DevMatrix& m, int64_t r) {
  RowRef ref;
  if constexpr (kType == kDevQ8_0) {
    ref.q = m.data + r * m.cols;
    ref.s = reinterpret_cast<const __half*>(m.data + m.rows * m.cols) + r * (m.cols / 32);
  } else {
    ref.q = m.data + r * m.cols * (kType == kDevF32 ? 4 : 2);
  }
  return ref;
}

__device__ inline float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Dot of one 16-byte weight chunk with the matching activation chunk (chunk index c).
template <int kType>
__device__ inline float ChunkDot(const uint4& w, const uint8_t* act_row, const float* act_scales,
                                 float w_scale, int64_t c) {
  if constexpr (kType == kDevQ8_0) {
    const uint4 a = *reinterpret_cast<const uint4*>(act_row + c * 16);
    int s = __dp4a(static_cast<int>(w.x), static_cast<int>(a.x), 0);
    s = __dp4a(static_cast<int>(w.y), static_cast<int>(a.y), s);
    s = __dp4a(static_cast<int>(w.z), static_cast<int>(a.z), s);
    s = __dp4a(static_cast<int>(w.w), static_cast<int>(a.w), s);
    return static_cast<float>(s) * (w_scale * act_scales[c / 2]);
  } else if constexpr (kType == kDevF32) {
    const float4 a = reinterpret_cast<const float4*>(act_row)[c];
    float acc = __uint_as_float(w.x) * a.x;
    acc = fmaf(__uint_as_float(w.y), a.y, acc);
    acc = fmaf(__uint_as_float(w.z), a.z, acc);
    acc = fmaf(__uint_as_float(w.w), a.w, acc);
    return acc;
  } else {
    const uint4 a = reinterpret_cast<const uint4*>(act_row)[c];
    const uint32_t wv[4] = {w.x, w.y, w.z, w.w};
    const uint32_t av[4] = {a.x, a.y, a.z, a.w};
    float acc = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float w0, w1, a0, a1;
      if constexpr (kType == kDevF16) {
        const float2 wf = __half22float2(*reinterpret_cast<const __half2*>(&wv[k]));
        const float2 af = __half22float2(*reinterpret_cast<const __half2*>(&av[k]));
        w0 = wf.x; w1 = wf.y; a0 = af.x; a1 = af.y;
      } else {
        w0 = BF16BitsToF32(wv[k] & 0xffff); w1 = BF16BitsToF32(wv[k] >> 16);
        a0 = BF16BitsToF32(av[k] & 0xffff); a1 = BF16BitsToF32(av[k] >> 16);
      }
      acc = fmaf(w0, a0, acc);
      acc = fmaf(w1, a1, acc);
    }
    return acc;
  }
}

// acc[r][t] = dot(row r, activation row t) summed over the warp (every lane gets the sums).
// rows[r].q == nullptr skips row r; act_rows[t] == nullptr skips token t.
template <int kType, int R, int NT>
__device__ inline void WarpDots(const RowRef (&rows)[R], int64_t cols, const uint8_t* const (&act_rows)[NT],
                                const float* const (&act_scales)[NT], float (&acc)[R][NT]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  const int64_t chunks = cols / kElemsPerChunk<kType>;
  for (int64_t c = lane; c < chunks; c += 32) {
    uint4 w[R];
    float ws[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (rows[r].q != nullptr) {
        w[r] = __ldcs(reinterpret_cast<const uint4*>(rows[r].q) + c);
        ws[r] = kType == kDevQ8_0 ? __half2float(rows[r].s[c / 2]) : 0.0f;
      } else {
        w[r] = make_uint4(0, 0, 0, 0);
        ws[r] = 0.0f;
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (act_rows[t] == nullptr) continue;
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] += ChunkDot<kType>(w[r], act_rows[t], act_scales[t], ws[r], c);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = WarpSum(acc[r][t]);
}

}  // namespace mer::cuda
