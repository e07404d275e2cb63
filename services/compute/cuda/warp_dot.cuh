// The inner loop shared by every matrix product of the cuda backend (dense mat-vec, grouped
// experts), written to give the CPU engine's results bit for bit: a group of lanes computes one
// weight row, each lane one of the CPU kernel's SIMD accumulator lanes, with the same fma chain
// and the same reduction tree, so the sums equal VecDot's/DotF32Ggml's exactly. That matters
// because a last-ulp difference can flip a later Q8_0 activation rounding or a router top-k
// choice, which shows as a jump in the logits many steps later (the same reason the CPU engine
// copies ggml's lane arithmetic, cpu_ops.h).
//
//   Q8_0: 8 lanes per row; lane l sums elements 4l..4l+3 of every 32-block as an exact integer
//         (dp4a), accumulated acc_l = fma(d_w * d_a, isum, acc_l) over blocks in order
//         (common/quant/q8_0_rows.cc), then ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
//   F16/BF16: 16 lanes per row; lane m accumulates elements 16c + m over c, then lanes m and
//         m + 8 added and reduced as above (common/quant/float_dot.cc, two __m256 accumulators).
//   F32:  32 lanes per row holding ggml_vec_dot_f32's 64 lanes (l and l + 32), reduced as
//         ReduceAcc64, the tail past the last multiple of 64 added by fma in order (cpu_ops.h).
// Each group reads its rows' bytes once per call; NT activation rows (cache-resident) reuse them.
// Sizes: cols a multiple of 32 (CHECKed at engine creation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/act_store.cuh"

namespace mer::cuda {

// Lanes per row.
template <int kType>
constexpr int kGroup = kType == kDevQ8_0 ? 8 : (kType == kDevF32 ? 32 : 16);

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

// Lane g of a group of G lanes prefetches every G-th 128-byte line of the row (quants or values,
// then for Q8_0 the row's block scales) into L2: weights depend on no earlier kernel, so this runs
// before WaitForPredecessor and the row's loads after it find L2 instead of DRAM.
template <int kType, int G>
__device__ inline void PrefetchRowToL2(const RowRef& row, int64_t cols) {
  if (row.q == nullptr) return;
  const int g = threadIdx.x % G;
  const int64_t bytes = ActRowBytes(kType, cols);  // the row's quants or values
  for (int64_t off = int64_t(g) * 128; off < bytes; off += G * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row.q + off));
  if constexpr (kType == kDevQ8_0) {
    const uint8_t* s = reinterpret_cast<const uint8_t*>(row.s);
    for (int64_t off = int64_t(g) * 128; off < cols / 16; off += G * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(s + off));
  }
}

// One lane's step over a run of 4 Q8_0 blocks (16 bytes of weights w and of activations a, lane
// l holding quants 4l..4l+3 of each block): the CPU's int32 lane sum of each block, scaled into
// the lane's chain in block order, acc = fma(d_w[k] * d_a[k], isum_k, acc). The inner step of
// every Q8_0 product here (GroupDots, GroupQ8_0Preload, StagedDots).
__device__ __forceinline__ float Q8_0RunStep(const uint4& w, const float (&w_scale)[4], const uint4& a,
                                             const float (&a_scale)[4], float acc) {
  const int w_int[4] = {static_cast<int>(w.x), static_cast<int>(w.y), static_cast<int>(w.z), static_cast<int>(w.w)};
  const int a_int[4] = {static_cast<int>(a.x), static_cast<int>(a.y), static_cast<int>(a.z), static_cast<int>(a.w)};
#pragma unroll
  for (int k = 0; k < 4; ++k)
    acc = fmaf(__fmul_rn(w_scale[k], a_scale[k]), static_cast<float>(__dp4a(w_int[k], a_int[k], 0)), acc);
  return acc;
}

// The f32 scales of a run's 4 Q8_0 blocks from their 4 f16s, loaded as one 8-byte value.
__device__ __forceinline__ void Q8_0RunScales(const uint2& s, float (&out)[4]) {
  const __half2 s01 = *reinterpret_cast<const __half2*>(&s.x), s23 = *reinterpret_cast<const __half2*>(&s.y);
  out[0] = __low2float(s01);
  out[1] = __high2float(s01);
  out[2] = __low2float(s23);
  out[3] = __high2float(s23);
}

template <int kType>
__device__ inline float HalfToF32(uint16_t v) {
  if constexpr (kType == kDevF16)
    return __half2float(__ushort_as_half(v));
  else
    return BF16BitsToF32(v);
}

// Sum over the group's lanes in the CPU's tree (see above); the result is valid in the group's
// first lane. All 32 lanes of the warp must call it.
template <int kType>
__device__ inline float GroupReduce(float v) {
  if constexpr (kType == kDevF32) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 16));
  if constexpr (kType != kDevQ8_0) v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 8));
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4));
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2));
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1));
  return v;
}

// acc[r][t] = dot(row r, activation row t), valid in the group's first lane (g == 0).
// rows[r].q == nullptr skips row r; act_rows[t] == nullptr skips token t. All lanes must call it.
// U: Q8_0 runs of 4 blocks loaded per lane per step (a tuning knob; results do not depend on it).
template <int kType, int R, int NT, int U = 2>
__device__ inline void GroupDots(const RowRef (&rows)[R], int64_t cols, const uint8_t* const (&act_rows)[NT],
                                 const float* const (&act_scales)[NT], float (&acc)[R][NT]) {
  constexpr int G = kGroup<kType>;
  const int g = threadIdx.x % G;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
  if constexpr (kType == kDevQ8_0) {
    const int64_t nb = cols / 32, nb4 = nb / 4 * 4;
    const bool aligned = nb % 4 == 0;  // scales of 4 blocks are one 8-byte (weights) / 16-byte (act) load
    // U runs of 4 blocks (U 16-byte loads per row) in flight per lane: decode is latency-bound
    // unless the grid keeps several MB of loads in flight.
    for (int64_t b0 = 0; b0 < nb4; b0 += 4 * U) {
      uint4 wq[U][R];
      float ws[U][R][4];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t b = b0 + 4 * u;
          const bool ok = b < nb4 && rows[r].q != nullptr;
          wq[u][r] = ok ? __ldcs(reinterpret_cast<const uint4*>(rows[r].q + b * 32) + g) : make_uint4(0, 0, 0, 0);
          if (ok && aligned) {
            // (Q8_0RunScales's conversion, written out: the call changes this loop's machine code)
            const uint2 sv = *reinterpret_cast<const uint2*>(rows[r].s + b);
            const __half2 s01 = *reinterpret_cast<const __half2*>(&sv.x),
                          s23 = *reinterpret_cast<const __half2*>(&sv.y);
            ws[u][r][0] = __low2float(s01);
            ws[u][r][1] = __high2float(s01);
            ws[u][r][2] = __low2float(s23);
            ws[u][r][3] = __high2float(s23);
          } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) ws[u][r][k] = ok ? __half2float(rows[r].s[b + k]) : 0.0f;
          }
        }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t b = b0 + 4 * u;
        if (b >= nb4) break;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (act_rows[t] == nullptr) continue;
          const uint4 aq = reinterpret_cast<const uint4*>(act_rows[t] + b * 32)[g];
          float as[4];
          if (aligned) {
            const float4 a4 = *reinterpret_cast<const float4*>(act_scales[t] + b);
            as[0] = a4.x;
            as[1] = a4.y;
            as[2] = a4.z;
            as[3] = a4.w;
          } else {
#pragma unroll
            for (int k = 0; k < 4; ++k) as[k] = act_scales[t][b + k];
          }
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][t] = Q8_0RunStep(wq[u][r], ws[u][r], aq, as, acc[r][t]);
        }
      }
    }
    for (int64_t b = nb4; b < nb; ++b) {  // blocks past the last run of 4: plain layout
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (act_rows[t] == nullptr) continue;
        const int aq = reinterpret_cast<const int*>(act_rows[t] + b * 32)[g];
        const float as = act_scales[t][b];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (rows[r].q == nullptr) continue;
          const int wq = reinterpret_cast<const int*>(rows[r].q + b * 32)[g];
          acc[r][t] = fmaf(__fmul_rn(__half2float(rows[r].s[b]), as), static_cast<float>(__dp4a(wq, aq, 0)), acc[r][t]);
        }
      }
    }
  } else if constexpr (kType == kDevF32) {
    const int64_t np = cols & ~int64_t{63};
    float hi[R][NT];
    // (unrolled so that several iterations' loads are in flight; the fma order is unchanged)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) hi[r][t] = 0.0f;
#pragma unroll 4
    for (int64_t i = 0; i < np; i += 64) {
      float w0[R], w1[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float* w = reinterpret_cast<const float*>(rows[r].q);
        w0[r] = w != nullptr ? __ldcs(w + i + g) : 0.0f;
        w1[r] = w != nullptr ? __ldcs(w + i + 32 + g) : 0.0f;
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (act_rows[t] == nullptr) continue;
        const float* a = reinterpret_cast<const float*>(act_rows[t]);
        const float a0 = a[i + g], a1 = a[i + 32 + g];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          acc[r][t] = fmaf(w0[r], a0, acc[r][t]);
          hi[r][t] = fmaf(w1[r], a1, hi[r][t]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[r][t] = __fadd_rn(acc[r][t], hi[r][t]);
  } else {
    const int64_t chunks = cols / 16;
    constexpr int kChunks = 8;
    for (int64_t c0 = 0; c0 < chunks; c0 += kChunks) {
      uint16_t wv[kChunks][R];
#pragma unroll
      for (int u = 0; u < kChunks; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const bool ok = c0 + u < chunks && rows[r].q != nullptr;
          wv[u][r] = ok ? __ldcs(reinterpret_cast<const unsigned short*>(rows[r].q) + (c0 + u) * 16 + g) : 0;
        }
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        if (c0 + u >= chunks) break;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (act_rows[t] == nullptr) continue;
          const float a = HalfToF32<kType>(reinterpret_cast<const uint16_t*>(act_rows[t])[(c0 + u) * 16 + g]);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][t] = fmaf(HalfToF32<kType>(wv[u][r]), a, acc[r][t]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = GroupReduce<kType>(acc[r][t]);
  if constexpr (kType == kDevF32) {
    // ggml_vec_dot_f32's tail, after the lanes are reduced: elements [np, cols) in order.
    const int64_t np = cols & ~int64_t{63};
    if (g == 0 && np < cols) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float* w = reinterpret_cast<const float*>(rows[r].q);
        if (w == nullptr) continue;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (act_rows[t] == nullptr) continue;
          const float* a = reinterpret_cast<const float*>(act_rows[t]);
          for (int64_t i = np; i < cols; ++i) acc[r][t] = fmaf(w[i], a[i], acc[r][t]);
        }
      }
    }
  }
}

// Bytes of shared memory StageActRows needs per activation row of cols elements (16-byte rows).
template <int kType>
__host__ __device__ inline int64_t StagedActBytes(int64_t cols) {
  return (ActRowBytes(kType, cols) + (kType == kDevQ8_0 ? cols / 32 * 4 : 0) + 15) / 16 * 16;
}
inline constexpr int64_t kMaxStagedActBytes = 48 * 1024;  // dynamic shared memory without opt-in
// The dynamic shared memory of a launch that stages nt activation rows of cols, or 0 where they do
// not fit (its kernel then reads them from global memory: stage_act = StagedActSmem(...) > 0).
template <int kType>
inline int64_t StagedActSmem(int nt, int64_t cols) {
  const int64_t bytes = nt * StagedActBytes<kType>(cols);
  return bytes <= kMaxStagedActBytes ? bytes : 0;
}

// The block copies the NT activation rows (and their Q8_0 scales; null rows skipped) into smem,
// row t at t * StagedActBytes, and points act_rows/act_scales at the copies. GroupDots reads a
// run's activations after the previous run's fma, so from global memory every run would cost an
// L2 round trip. Every thread of the block must call it; a caller that stages again in a loop
// must __syncthreads() first (the previous rows may still be read). A thread loads its share of
// every row (quants and scales) before it stores any: a load after a store waits for the store's
// data, one L2 round trip per row and per array.
template <int kType, int NT>
__device__ inline void StageActRows(uint4* smem, const uint8_t* (&act_rows)[NT], const float* (&act_scales)[NT],
                                    int64_t cols) {
  const int64_t quant_vecs = ActRowBytes(kType, cols) / 16;  // quants or values, before Q8_0's scales
  const int64_t n_scales = kType == kDevQ8_0 ? cols / 32 : 0;
  const int64_t n = quant_vecs > n_scales ? quant_vecs : n_scales;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    uint4 q[NT];
    float sc[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const bool row = act_rows[t] != nullptr;
      q[t] = row && i < quant_vecs ? reinterpret_cast<const uint4*>(act_rows[t])[i] : make_uint4(0, 0, 0, 0);
      if constexpr (kType == kDevQ8_0) sc[t] = row && i < n_scales ? act_scales[t][i] : 0.0f;
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if (act_rows[t] == nullptr) continue;
      uint8_t* dst = reinterpret_cast<uint8_t*>(smem) + t * StagedActBytes<kType>(cols);
      if (i < quant_vecs) reinterpret_cast<uint4*>(dst)[i] = q[t];
      if constexpr (kType == kDevQ8_0)
        if (i < n_scales) reinterpret_cast<float*>(dst + quant_vecs * 16)[i] = sc[t];
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (act_rows[t] == nullptr) continue;
    uint8_t* dst = reinterpret_cast<uint8_t*>(smem) + t * StagedActBytes<kType>(cols);
    if constexpr (kType == kDevQ8_0) act_scales[t] = reinterpret_cast<float*>(dst + quant_vecs * 16);
    act_rows[t] = dst;
  }
  __syncthreads();
}

// Q8_0 rows of a lane group (R rows of nb blocks, nb % 4 == 0, nb / 4 <= kRuns) whose weights
// are loaded before the activations exist: Load may precede WaitForPredecessor, Dot then runs
// GroupDots<kDevQ8_0, R, 1>'s chains over them (bit for bit; the result in the group's lane 0).
template <int R, int kRuns>
struct GroupQ8_0Preload {
  uint4 wq[kRuns][R];
  uint2 ws[kRuns][R];

  __host__ __device__ static constexpr bool Fits(int64_t nb) { return nb % 4 == 0 && nb / 4 <= kRuns; }

  __device__ void Load(const RowRef (&rows)[R], int64_t nb) {
    const int g = threadIdx.x % kGroup<kDevQ8_0>;
#pragma unroll
    for (int i = 0; i < kRuns; ++i) {
      if (4 * i >= nb) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool ok = rows[r].q != nullptr;
        wq[i][r] =
            ok ? __ldcs(reinterpret_cast<const uint4*>(rows[r].q + int64_t(i) * 128) + g) : make_uint4(0, 0, 0, 0);
        ws[i][r] = ok ? *reinterpret_cast<const uint2*>(rows[r].s + 4 * i) : make_uint2(0, 0);
      }
    }
  }

  __device__ void Dot(int64_t nb, const uint8_t* act_q, const float* act_s, float (&acc)[R]) const {
    const int g = threadIdx.x % kGroup<kDevQ8_0>;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
#pragma unroll
    for (int i = 0; i < kRuns; ++i) {
      if (4 * i >= nb) break;
      const uint4 aq = reinterpret_cast<const uint4*>(act_q + int64_t(i) * 128)[g];
      const float4 a4 = *reinterpret_cast<const float4*>(act_s + 4 * i);
      const float as[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float w_s[4];
        Q8_0RunScales(ws[i][r], w_s);
        acc[r] = Q8_0RunStep(wq[i][r], w_s, aq, as, acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = GroupReduce<kDevQ8_0>(acc[r]);
  }
};

// Decode (one activation row): a whole warp per weight row, for Q8_0 rows of a multiple of 4
// blocks. The 8-lane group's chain per row cannot be split (the sum would change), but only its
// fma chain is sequential: the loads and the dp4a integer sums are not. So all 32 lanes load the
// row's runs of 4 blocks at once (one DRAM round trip instead of one per run), compute each
// block's exact integer sum and scale product, leave them in shared memory, and then 8 lanes per
// row run exactly the chains of GroupDots over them: acc_l = fma(d_w * d_a, isum_l, acc_l) in
// block order, reduced in the same tree. Bit for bit GroupDots<kDevQ8_0>.
//
// Use: WarpQ8_0Rows<NR> w; w.Load(rows, nb) (weights only: may precede WaitForPredecessor);
// then w.Finish(rows, nb, act_q, act_s, smem, out). NR rows of nb blocks, nb a multiple of 4,
// NR * nb / 4 <= 4 * kWarpQ8_0RunsPerLane (WarpQ8_0Fits).
// smem: kWarpQ8_0SmemFloats(NR, nb) floats per warp. out[r] is valid in lane 0 of the warp.
inline constexpr int kWarpQ8_0RunsPerLane = 8;
__host__ __device__ constexpr bool WarpQ8_0Fits(int nr, int64_t cols) {
  return cols % 128 == 0 && nr * (cols / 128) <= 4 * kWarpQ8_0RunsPerLane;
}
__host__ __device__ constexpr int64_t kWarpQ8_0SmemFloats(int nr, int64_t nb) { return nr * (8 * (nb + nb / 4) + nb); }

template <int NR>
struct WarpQ8_0Rows {
  static constexpr int kRuns = kWarpQ8_0RunsPerLane;
  uint4 wq[kRuns];
  uint2 ws[kRuns];

  // Lane group g = lane / 8 takes the warp's runs g, g + 4, ...; run q is run q % nr of row q / nr.
  __device__ void Load(const RowRef (&rows)[NR], int64_t nb) {
    const int lane = threadIdx.x % 32, g = lane / 8, l = lane % 8;
    const int nr = static_cast<int>(nb / 4);
#pragma unroll
    for (int i = 0; i < kRuns; ++i) {
      const int q = g + 4 * i;
      if (q >= NR * nr) break;
      const int r = q / nr, j = q % nr;
      if (rows[r].q == nullptr) continue;
      wq[i] = __ldcs(reinterpret_cast<const uint4*>(rows[r].q + int64_t(j) * 128) + l);
      ws[i] = *reinterpret_cast<const uint2*>(rows[r].s + 4 * j);
    }
  }

  __device__ void Finish(const RowRef (&rows)[NR], int64_t nb, const uint8_t* act_q, const float* act_s, float* smem,
                         float (&out)[NR]) {
    const int lane = threadIdx.x % 32, g = lane / 8, l = lane % 8;
    const int nr = static_cast<int>(nb / 4);
    // Per row: isum [nb][8], each run of 4 blocks followed by 8 floats of padding (the 4 lane groups
    // store runs j..j+3 at once; the padding puts them in different banks), then the nb products.
    const int64_t row_floats = kWarpQ8_0SmemFloats(1, nb), isum_floats = 8 * (nb + nb / 4);
    const auto isum_at = [&](int r, int64_t b, int lane_l) { return smem + r * row_floats + 8 * (b + b / 4) + lane_l; };
    const auto prod_at = [&](int r, int64_t b) { return smem + r * row_floats + isum_floats + b; };
    // Every run's activations first: a load after the isum stores below would wait for them, and
    // so for the previous run's loads (one L2 round trip per run).
    uint4 aqs[kRuns];
    float4 a4s[kRuns];
#pragma unroll
    for (int i = 0; i < kRuns; ++i) {
      const int q = g + 4 * i;
      if (q >= NR * nr) break;
      const int j = q % nr;
      aqs[i] = reinterpret_cast<const uint4*>(act_q + int64_t(j) * 128)[l];
      a4s[i] = *reinterpret_cast<const float4*>(act_s + 4 * j);
    }
#pragma unroll
    for (int i = 0; i < kRuns; ++i) {
      const int q = g + 4 * i;
      if (q >= NR * nr) break;
      const int r = q / nr, j = q % nr;
      if (rows[r].q == nullptr) continue;
      const uint4 aq = aqs[i];
      const float4 a4 = a4s[i];
      const float as[4] = {a4.x, a4.y, a4.z, a4.w};
      float w_s[4];
      Q8_0RunScales(ws[i], w_s);
      const int a_int[4] = {static_cast<int>(aq.x), static_cast<int>(aq.y), static_cast<int>(aq.z),
                            static_cast<int>(aq.w)};
      const int w_int[4] = {static_cast<int>(wq[i].x), static_cast<int>(wq[i].y), static_cast<int>(wq[i].z),
                            static_cast<int>(wq[i].w)};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        *isum_at(r, 4 * j + k, l) = static_cast<float>(__dp4a(w_int[k], a_int[k], 0));
        if (l == 0) *prod_at(r, 4 * j + k) = __fmul_rn(w_s[k], as[k]);
      }
    }
    __syncwarp();
    float acc = 0.0f;
    const int r_chain = lane / 8;  // lanes 8r..8r+7 run row r's 8 chains
    if (r_chain < NR && rows[r_chain < NR ? r_chain : 0].q != nullptr) {
#pragma unroll 8
      for (int64_t b = 0; b < nb; ++b) acc = fmaf(*prod_at(r_chain, b), *isum_at(r_chain, b, l), acc);
    }
    acc = GroupReduce<kDevQ8_0>(acc);  // each 8-lane group's tree; row r's sum in lane 8r
#pragma unroll
    for (int r = 0; r < NR; ++r) out[r] = __shfl_sync(0xffffffffu, acc, 8 * r);
    __syncwarp();  // the shared memory may be reused by the caller's next rows
  }
};

}  // namespace mer::cuda
