// The inner loop of the matrix products of the 256-element block types with Q8_K activations
// (dense mat-vec and grouped experts), bit-exact with the CPU engine's VecDotRowsQ2_K / Q3_K /
// Q4_K / Q5_K / Q6_K / IQ4_XS / IQ2_XXS / IQ2_XS / IQ2_S / IQ3_XXS / IQ3_S / IQ1_S
// (common/quant/q2_k_rows.cc .. q6_k_rows.cc, iq4_rows.cc, iq2_rows.cc, iq3_rows.cc, iq1_rows.cc:
// the avx2 and avx512 variants form the same integers and floats; the scalar one, run only where
// MER_CPU_KERNELS=scalar forces it, sums in another order):
//
//   8 lanes per row (kquant_layout.cuh). Per block, in order, lane i forms the CPU's int32 lane i
//   exactly (Q4_KLaneSum, Q5_KLaneSum, ...) and accumulates acc_i = fma(d_w * d_a, (float)isum,
//   acc_i); Q4_K lanes 0..3 also acc_m_i = fma(dmin_w * d_a, (float)prod_m, acc_m_i); Q5_K lane 0
//   also the block's one mins integer, acc_m = fma(-(dmin_w * d_a), (float)prod_m, acc_m); Q2_K
//   lane i first its mins integer into the same chain, acc_i = fma(-(d_a * dmin_w), (float)m_i,
//   acc_i), then its scaled sum as above; IQ1_S lane 0 also the block's one offsets integer,
//   acc_m = fma(d_w * d_a, (float)sum_offsets, acc_m). Then
//   HorizontalSum: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)); for Q4_K minus the 4-lane
//   (m0+m2) + (m1+m3); for Q5_K plus acc_m; for IQ2_XXS, IQ2_XS and IQ2_S times 0.125, for IQ3_XXS
//   0.25; for IQ1_S plus 0.125 * acc_m (a product, then a sum: the CPU kernels are built without
//   contraction).
//
// Per lane and block: one 16-byte load of quants (Q6_K and Q5_K with their qh bytes; Q3_K and Q2_K
// 8 bytes; the grid IQ types their indices (IQ2_S with its signs, IQ3_S 8 bytes more of signs) and
// a grid point per sub-block) and one header load shared by the group; per token 32 bytes of
// activation quants, d, and the bsums where the type needs them (Q5_K and IQ1_S in lane 0 only).
//
// Q4_0 and IQ4_NL (Q8_0 activations) take Table4GroupDots instead, the CPU's order of
// common/quant/table4_rows.h: per row one f32 chain over the blocks, acc = fma((float)isum_b,
// d_w * d_a, acc), isum_b the block's exact int32 sum (each lane's 4 products, added over the
// group by shuffles). Q5_0 (Q8_0 activations) keeps the Q8_0 kernels' order there: lane i's own
// chain acc_i = fma(d_w * d_a, (float)isum_i, acc_i), then the 8-lane tree; Q4_1 and Q5_1 (Q8_1
// activations) the same with unsigned codes, and lane 0 also acc_m = fma(m_w, s_a, acc_m) per
// block, added after the tree. BlockRow / BlockAct / BlockGroupDots pick the family by type.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/iq_grids.cuh"
#include "services/compute/cuda/kquant_layout.cuh"

namespace mer::cuda {

inline constexpr int kKQuantGroup = 8;  // lanes per row

// Row r of a K-quant matrix: its base, block count and the row's first block.
struct KQuantRowRef {
  const uint8_t* m = nullptr;  // nullptr: no row (the lanes still join the shuffles)
  int64_t n = 0;
  int64_t b0 = 0;
};
__device__ inline KQuantRowRef KQuantRow(const DevMatrix& m, int64_t r) {
  const int64_t nb = m.cols / kKBlock;
  return {m.data, m.rows * nb, r * nb};
}

// Q8_K activation row t of act (kquant_layout.cuh).
struct KQuantActRef {
  const uint8_t* row = nullptr;  // nullptr: no token
  const float* d = nullptr;
};
__device__ inline KQuantActRef KQuantAct(const DevAct& act, int64_t t) {
  return {act.data + t * Q8_KRowBytes(act.stride), act.scales + t * (act.stride / kKBlock)};
}

// Sums over the 8 lanes (4 for the Q4_K min term) in the CPU's trees; valid in the group's
// first lane. All 32 lanes of the warp must call them.
__device__ inline float KQuantReduce8(float v) {
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4));
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2));
  return __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1));
}
__device__ inline float KQuantReduce4(float v) {
  v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2));
  return __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1));
}

// out[r][t] = dot(row r, activation row t) for rows of nb blocks, valid in the group's first
// lane (threadIdx.x % 8 == 0). All lanes of the warp must call it with the same nb and the same
// null pattern of acts. U: blocks loaded per lane before they are used (a tuning knob; the
// results do not depend on it).
template <int kType, int R, int NT, int U>
__device__ inline void KQuantGroupDots(const KQuantRowRef (&rows)[R], int64_t nb, const KQuantActRef (&acts)[NT],
                                       int64_t act_stride, float (&out)[R][NT]) {
  static_assert(kType == kDevQ4_K || kType == kDevQ5_K || kType == kDevQ6_K || kType == kDevIQ4_XS ||
                kType == kDevIQ2_XXS || kType == kDevQ3_K || kType == kDevQ2_K || kType == kDevIQ2_XS ||
                kType == kDevIQ3_XXS || kType == kDevIQ3_S || kType == kDevIQ2_S || kType == kDevIQ1_S);
  constexpr bool kQ4 = kType == kDevQ4_K;
  const int g = threadIdx.x % kKQuantGroup;
  float acc[R][NT], acc_m[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = acc_m[r][t] = 0.0f;
  for (int64_t b0 = 0; b0 < nb; b0 += U) {
    uint4 wq[U][R];   // Q4_K, Q5_K, IQ4_XS: qs words; Q6_K: ql words; IQ2_XXS: sign words 0..3;
                      // Q3_K: hmask word (x), scale words (y, z, w); IQ3_S: sign words (x, y), qh
                      // (z, w); IQ2_S: index and sign words; IQ1_S: qh
    uint4 wh[U][R];   // Q4_K, Q5_K: header; Q6_K, Q2_K: scales; IQ2_XXS: sign words 4..7; IQ3_S:
                      // scales (x); IQ2_S: qh and scales
    uint2 wqh[U][R];  // Q6_K: qh words; Q5_K: qh word (x); IQ4_XS: header; IQ2_XXS, IQ3_S, IQ1_S:
                      // grid indices; Q3_K, Q2_K: qs words
    float wd[U][R], wdmin[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t b = rows[r].b0 + b0 + u;
        const bool ok = b0 + u < nb && rows[r].m != nullptr;
        wq[u][r] = wh[u][r] = make_uint4(0, 0, 0, 0);
        wqh[u][r] = make_uint2(0, 0);
        wd[u][r] = wdmin[u][r] = 0.0f;
        if (!ok) continue;
        const uint8_t* m = rows[r].m;
        if constexpr (kQ4) {
          wq[u][r] = __ldcs(reinterpret_cast<const uint4*>(m + Q4_KQsOffset(b, g)));
          wh[u][r] = *reinterpret_cast<const uint4*>(m + Q4_KHeaderOffset(rows[r].n, b));
          wd[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(wh[u][r].x & 0xffffu)));
          wdmin[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(wh[u][r].x >> 16)));
        } else if constexpr (kType == kDevQ5_K) {
          wq[u][r] = __ldcs(reinterpret_cast<const uint4*>(m + Q5_KQsOffset(b, g)));
          wqh[u][r].x = __ldcs(reinterpret_cast<const uint32_t*>(m + Q5_KQhOffset(rows[r].n, b, g)));
          wh[u][r] = *reinterpret_cast<const uint4*>(m + Q5_KHeaderOffset(rows[r].n, b));
          wd[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(wh[u][r].x & 0xffffu)));
          wdmin[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(wh[u][r].x >> 16)));
        } else if constexpr (kType == kDevIQ4_XS) {
          wq[u][r] = __ldcs(reinterpret_cast<const uint4*>(m + IQ4_XSQsOffset(b, g)));
          wqh[u][r] = *reinterpret_cast<const uint2*>(m + IQ4_XSHeaderOffset(rows[r].n, b));
          wd[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(wqh[u][r].x & 0xffffu)));
        } else if constexpr (kType == kDevQ3_K) {
          wqh[u][r] = __ldcs(reinterpret_cast<const uint2*>(m + Q3_KQsOffset(b, g)));
          wq[u][r].x = __ldcs(reinterpret_cast<const uint32_t*>(m + Q3_KHmaskOffset(rows[r].n, b, g)));
          const uint32_t* sc = reinterpret_cast<const uint32_t*>(m + Q3_KScalesOffset(rows[r].n, b));
          wq[u][r].y = sc[0];
          wq[u][r].z = sc[1];
          wq[u][r].w = sc[2];
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + Q3_KDOffset(rows[r].n, b)));
        } else if constexpr (kType == kDevQ2_K) {
          wqh[u][r] = __ldcs(reinterpret_cast<const uint2*>(m + Q2_KQsOffset(b, g)));
          wh[u][r] = *reinterpret_cast<const uint4*>(m + Q2_KScalesOffset(rows[r].n, b));
          const uint32_t dd = *reinterpret_cast<const uint32_t*>(m + Q2_KDOffset(rows[r].n, b));
          wd[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dd & 0xffffu)));
          wdmin[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dd >> 16)));
        } else if constexpr (kType == kDevIQ2_XS) {
          wq[u][r] = __ldcs(reinterpret_cast<const uint4*>(m + IQ2_XSWordsOffset(b, g)));
          wqh[u][r] = *reinterpret_cast<const uint2*>(m + IQ2_XSScalesOffset(rows[r].n, b));
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + IQ2_XSDOffset(rows[r].n, b)));
        } else if constexpr (kType == kDevIQ3_XXS) {
          wqh[u][r] = __ldcs(reinterpret_cast<const uint2*>(m + IQ3_XXSIndexOffset(b, g)));
          const uint4* words = reinterpret_cast<const uint4*>(m + IQ3_XXSWordsOffset(rows[r].n, b));
          wq[u][r] = words[0];
          wh[u][r] = words[1];
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + IQ3_XXSDOffset(rows[r].n, b)));
        } else if constexpr (kType == kDevIQ3_S) {
          wqh[u][r] = __ldcs(reinterpret_cast<const uint2*>(m + IQ3_SIndexOffset(b, g)));
          const uint2 signs = __ldcs(reinterpret_cast<const uint2*>(m + IQ3_SSignsOffset(rows[r].n, b, g)));
          const uint2 qh = *reinterpret_cast<const uint2*>(m + IQ3_SQhOffset(rows[r].n, b));
          wq[u][r] = make_uint4(signs.x, signs.y, qh.x, qh.y);
          wh[u][r].x = *reinterpret_cast<const uint32_t*>(m + IQ3_SScalesOffset(rows[r].n, b));
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + IQ3_SDOffset(rows[r].n, b)));
        } else if constexpr (kType == kDevIQ2_S) {
          wq[u][r] = __ldcs(reinterpret_cast<const uint4*>(m + IQ2_SWordsOffset(b, g)));
          wh[u][r] = *reinterpret_cast<const uint4*>(m + IQ2_SHeaderOffset(rows[r].n, b));
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + IQ2_SDOffset(rows[r].n, b)));
        } else if constexpr (kType == kDevIQ1_S) {
          wqh[u][r] = __ldcs(reinterpret_cast<const uint2*>(m + IQ1_SIndexOffset(b, g)));
          wq[u][r] = *reinterpret_cast<const uint4*>(m + IQ1_SQhOffset(rows[r].n, b));
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + IQ1_SDOffset(rows[r].n, b)));
        } else if constexpr (kType == kDevIQ2_XXS) {
          wqh[u][r] = __ldcs(reinterpret_cast<const uint2*>(m + IQ2_XXSIndexOffset(b, g)));
          const uint4* words = reinterpret_cast<const uint4*>(m + IQ2_XXSWordsOffset(rows[r].n, b));
          wq[u][r] = words[0];
          wh[u][r] = words[1];
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + IQ2_XXSDOffset(rows[r].n, b)));
        } else {
          wq[u][r] = __ldcs(reinterpret_cast<const uint4*>(m + Q6_KQlOffset(b, g)));
          wqh[u][r] = __ldcs(reinterpret_cast<const uint2*>(m + Q6_KQhOffset(rows[r].n, b, g)));
          wh[u][r] = *reinterpret_cast<const uint4*>(m + Q6_KScalesOffset(rows[r].n, b));
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + Q6_KDOffset(rows[r].n, b)));
        }
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + u;  // block within the row
      if (b >= nb) break;
      Q4_KScales s[R];
      if constexpr (kQ4 || kType == kDevQ5_K) {
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] = DecodeQ4_KScales(wh[u][r]);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (acts[t].row == nullptr) continue;
        const uint4* aq = reinterpret_cast<const uint4*>(acts[t].row + Q8_KLaneOffset(b, g));
        const uint4 a0 = aq[0], a1 = aq[1];
        const float ad = acts[t].d[b];
        const uint8_t* bsums = acts[t].row + Q8_KBsumsOffset(act_stride, b);
        if constexpr (kQ4) {
          const uint2 bs = g < 4 ? *reinterpret_cast<const uint2*>(bsums + 8 * g) : make_uint2(0, 0);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(Q4_KLaneSum(wq[u][r], s[r], a0, a1)), acc[r][t]);
            if (g < 4)
              acc_m[r][t] = fmaf(__fmul_rn(wdmin[u][r], ad), __int2float_rn(Q4_KMinLaneSum(s[r], g, bs)), acc_m[r][t]);
          }
        } else if constexpr (kType == kDevQ5_K) {
          uint4 bs0 = make_uint4(0, 0, 0, 0), bs1 = make_uint4(0, 0, 0, 0);
          if (g == 0) {
            bs0 = *reinterpret_cast<const uint4*>(bsums);
            bs1 = *reinterpret_cast<const uint4*>(bsums + 16);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(Q5_KLaneSum(wq[u][r], wqh[u][r].x, s[r], a0, a1)),
                             acc[r][t]);
            if (g == 0)
              acc_m[r][t] = fmaf(-__fmul_rn(wdmin[u][r], ad), __int2float_rn(Q5_KMinSum(s[r], bs0, bs1)), acc_m[r][t]);
          }
        } else if constexpr (kType == kDevIQ4_XS) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = IQ4_XSLaneSum(wq[u][r], wqh[u][r], a0, a1);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else if constexpr (kType == kDevQ3_K) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const uint3 sc = make_uint3(wq[u][r].y, wq[u][r].z, wq[u][r].w);
            const int isum = Q3_KLaneSum(wqh[u][r], wq[u][r].x, sc, g, a0, a1);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else if constexpr (kType == kDevQ2_K) {
          const uint32_t bs = *reinterpret_cast<const uint32_t*>(bsums + 4 * g);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            acc[r][t] = fmaf(-__fmul_rn(ad, wdmin[u][r]), __int2float_rn(Q2_KMinLaneSum(wh[u][r], g, bs)), acc[r][t]);
            acc[r][t] =
                fmaf(__fmul_rn(ad, wd[u][r]), __int2float_rn(Q2_KLaneSum(wqh[u][r], wh[u][r], g, a0, a1)), acc[r][t]);
          }
        } else if constexpr (kType == kDevIQ2_XS) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = IQ2_XSLaneSum(wq[u][r], wqh[u][r], g, kDevIQ2_XSGrid, a0, a1);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else if constexpr (kType == kDevIQ3_XXS) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = IQ3_XXSLaneSum(wqh[u][r], wq[u][r], wh[u][r], g, kDevIQ3_XXSGrid, a0, a1);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else if constexpr (kType == kDevIQ3_S) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = IQ3_SLaneSum(wqh[u][r], make_uint2(wq[u][r].x, wq[u][r].y),
                                          make_uint2(wq[u][r].z, wq[u][r].w), wh[u][r].x, g, kDevIQ3_SGrid, a0, a1);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else if constexpr (kType == kDevIQ2_S) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = IQ2_SLaneSum(wq[u][r], wh[u][r], g, kDevIQ2_SGrid, a0, a1);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else if constexpr (kType == kDevIQ1_S) {
          uint4 bs0 = make_uint4(0, 0, 0, 0), bs1 = make_uint4(0, 0, 0, 0);
          if (g == 0) {
            bs0 = *reinterpret_cast<const uint4*>(bsums);
            bs1 = *reinterpret_cast<const uint4*>(bsums + 16);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const float dd = __fmul_rn(wd[u][r], ad);
            const int isum = IQ1_SLaneSum(wqh[u][r], wq[u][r], g, kDevIQ1_SGrid, a0, a1);
            acc[r][t] = fmaf(dd, __int2float_rn(isum), acc[r][t]);
            if (g == 0) acc_m[r][t] = fmaf(dd, __int2float_rn(IQ1_SOffsetSum(wq[u][r], bs0, bs1)), acc_m[r][t]);
          }
        } else if constexpr (kType == kDevIQ2_XXS) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = IQ2_XXSLaneSum(wqh[u][r], wq[u][r], wh[u][r], g, kDevIQ2_XXSGrid, a0, a1);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else {
          const uint32_t bs = *reinterpret_cast<const uint32_t*>(bsums + 4 * g);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = Q6_KLaneSum(wq[u][r], wqh[u][r], wh[u][r], a0, a1, g, bs);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float sum = KQuantReduce8(acc[r][t]);
      if constexpr (kQ4) {
        out[r][t] = __fsub_rn(sum, KQuantReduce4(acc_m[r][t]));
      } else if constexpr (kType == kDevQ5_K) {
        out[r][t] = __fadd_rn(sum, acc_m[r][t]);  // lane 0's chain
      } else if constexpr (kType == kDevIQ2_XXS || kType == kDevIQ2_XS || kType == kDevIQ2_S) {
        out[r][t] = __fmul_rn(0.125f, sum);
      } else if constexpr (kType == kDevIQ3_XXS) {
        out[r][t] = __fmul_rn(0.25f, sum);
      } else if constexpr (kType == kDevIQ1_S) {
        out[r][t] = __fadd_rn(sum, __fmul_rn(kIQ1_SDelta, acc_m[r][t]));  // lane 0's chain
      } else {
        out[r][t] = sum;
      }
    }
}

// Q4_0 / IQ4_NL / Q5_0 rows (kquant_layout.cuh) against Q8_0 activation rows (device_layout.cuh,
// scales as f32), Q4_1 / Q5_1 rows against Q8_1 rows (scales as f16 d | s << 16), with
// KQuantGroupDots' contract; out is valid in the group's first lane (Q4_0, IQ4_NL: in every lane). nb: blocks of
// 32 per row; act_stride: the activation rows' stride (their Q8_0 interleave follows it).
template <int kType, int R, int NT, int U>
__device__ inline void Table4GroupDots(const KQuantRowRef (&rows)[R], int64_t nb, const KQuantActRef (&acts)[NT],
                                       int64_t act_stride, float (&out)[R][NT]) {
  static_assert(kType == kDevQ4_0 || kType == kDevIQ4_NL || kType == kDevQ5_0 || kType == kDevQ4_1 ||
                kType == kDevQ5_1);
  constexpr bool kIQ4 = kType == kDevIQ4_NL, kQ5 = kType == kDevQ5_0;
  constexpr bool kQ8_1Act = kType == kDevQ4_1 || kType == kDevQ5_1;  // per-lane chains plus the m * s chain
  const int g = threadIdx.x % kKQuantGroup;
  const int64_t act_blocks = act_stride / kTable4Block;
  float acc[R][NT], acc_m[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = acc_m[r][t] = 0.0f;
  for (int64_t b0 = 0; b0 < nb; b0 += U) {
    uint32_t wc[U][R];   // the lane's 4 codes
    uint32_t wqh[U][R];  // Q5_0, Q5_1: the block's fifth bits
    float wd[U][R], wm[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t b = rows[r].b0 + b0 + u;
        wc[u][r] = wqh[u][r] = 0;
        wd[u][r] = wm[u][r] = 0.0f;
        if (b0 + u >= nb || rows[r].m == nullptr) continue;
        const uint8_t* m = rows[r].m;
        wc[u][r] = __ldcs(reinterpret_cast<const unsigned short*>(m + Table4CodesOffset(b, g)));
        if constexpr (kQ5) {
          wqh[u][r] = *reinterpret_cast<const uint32_t*>(m + Q5_0QhOffset(rows[r].n, b));
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + Q5_0DOffset(rows[r].n, b)));
        } else if constexpr (kQ8_1Act) {
          constexpr bool kFive = kType == kDevQ5_1;
          if constexpr (kFive) wqh[u][r] = *reinterpret_cast<const uint32_t*>(m + Q5_1QhOffset(rows[r].n, b));
          const uint32_t dm =
              *reinterpret_cast<const uint32_t*>(m + (kFive ? Q5_1DmOffset(rows[r].n, b) : Q4_1DmOffset(rows[r].n, b)));
          wd[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dm & 0xffffu)));
          wm[u][r] = __half2float(__ushort_as_half(static_cast<unsigned short>(dm >> 16)));
        } else {
          wd[u][r] = __half2float(*reinterpret_cast<const __half*>(m + Table4DOffset(rows[r].n, b)));
        }
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t b = b0 + u;  // block within the row
      if (b >= nb) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (acts[t].row == nullptr) continue;
        const uint32_t a =
            *reinterpret_cast<const uint32_t*>(acts[t].row + Q8_0QuantOffset(32 * b + 4 * g, act_blocks));
        if constexpr (kQ8_1Act) {
          const uint32_t ds = reinterpret_cast<const uint32_t*>(acts[t].d)[b];
          const float ad = __half2float(__ushort_as_half(static_cast<unsigned short>(ds & 0xffffu)));
          const float sa = __half2float(__ushort_as_half(static_cast<unsigned short>(ds >> 16)));
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = Q5_1LaneSum(wc[u][r], wqh[u][r], g, a);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
            if (g == 0) acc_m[r][t] = fmaf(wm[u][r], sa, acc_m[r][t]);
          }
        } else if constexpr (kQ5) {
          const float ad = acts[t].d[b];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (rows[r].m == nullptr) continue;
            const int isum = Q5_0LaneSum(wc[u][r], wqh[u][r], g, a);
            acc[r][t] = fmaf(__fmul_rn(wd[u][r], ad), __int2float_rn(isum), acc[r][t]);
          }
        } else {
          const float ad = acts[t].d[b];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            int isum = rows[r].m != nullptr ? Table4LanePart<kIQ4>(wc[u][r], a) : 0;
            isum += __shfl_xor_sync(0xffffffffu, isum, 4);
            isum += __shfl_xor_sync(0xffffffffu, isum, 2);
            isum += __shfl_xor_sync(0xffffffffu, isum, 1);
            if (rows[r].m != nullptr) acc[r][t] = fmaf(__int2float_rn(isum), __fmul_rn(wd[u][r], ad), acc[r][t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      if constexpr (kQ8_1Act) {
        out[r][t] = __fadd_rn(KQuantReduce8(acc[r][t]), acc_m[r][t]);  // lane 0's m * s chain
      } else {
        out[r][t] = kQ5 ? KQuantReduce8(acc[r][t]) : acc[r][t];
      }
    }
}

// The two families by weight type: elements per block, row and activation references, the dots.
template <int kType>
inline constexpr bool kIsTable4 =
    kType == kDevQ4_0 || kType == kDevIQ4_NL || kType == kDevQ5_0 || kType == kDevQ4_1 || kType == kDevQ5_1;
template <int kType>
inline constexpr int kBlockElems = kIsTable4<kType> ? kTable4Block : kKBlock;

template <int kType>
__device__ inline KQuantRowRef BlockRow(const DevMatrix& m, int64_t r) {
  if constexpr (kIsTable4<kType>) {
    const int64_t nb = m.cols / kTable4Block;
    return {m.data, m.rows * nb, r * nb};
  } else {
    return KQuantRow(m, r);
  }
}

template <int kType>
__device__ inline KQuantActRef BlockAct(const DevAct& act, int64_t t) {
  if constexpr (kIsTable4<kType>) {
    return {act.data + t * act.stride, act.scales + t * (act.stride / kTable4Block)};
  } else {
    return KQuantAct(act, t);
  }
}

template <int kType, int R, int NT, int U>
__device__ inline void BlockGroupDots(const KQuantRowRef (&rows)[R], int64_t nb, const KQuantActRef (&acts)[NT],
                                      int64_t act_stride, float (&out)[R][NT]) {
  if constexpr (kIsTable4<kType>) {
    Table4GroupDots<kType, R, NT, U>(rows, nb, acts, act_stride, out);
  } else {
    KQuantGroupDots<kType, R, NT, U>(rows, nb, acts, act_stride, out);
  }
}

// Host side: elements per block of a type of either family (0 for any other type), and the
// activation type its rows are dotted with.
inline int BlockElemsOf(int type) {
  switch (type) {
    case kDevQ2_K:
    case kDevQ3_K:
    case kDevQ4_K:
    case kDevQ5_K:
    case kDevQ6_K:
    case kDevIQ4_XS:
    case kDevIQ2_XXS:
    case kDevIQ2_XS:
    case kDevIQ2_S:
    case kDevIQ3_XXS:
    case kDevIQ3_S:
    case kDevIQ1_S:
      return kKBlock;
    case kDevQ4_0:
    case kDevIQ4_NL:
    case kDevQ5_0:
    case kDevQ4_1:
    case kDevQ5_1:
      return kTable4Block;
    default:
      return 0;
  }
}
inline int BlockActTypeOf(int type) {
  if (type == kDevQ4_1 || type == kDevQ5_1) return kDevQ8_1;
  return BlockElemsOf(type) == kTable4Block ? kDevQ8_0 : kDevQ8_K;
}

}  // namespace mer::cuda
