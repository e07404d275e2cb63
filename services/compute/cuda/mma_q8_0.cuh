// Multi-token Q8_0 products on the tensor cores (prompts, batches), bit for bit the CPU engine's.
//
// The CPU's Q8_0 dot (warp_dot.cuh) keeps 8 lane chains per row: lane l sums quants 4l..4l+3 of
// each 32-block as an exact int32, acc_l = fma(d_w * d_a, isum, acc_l) over the blocks in order,
// then ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)). Its integer sums are 4-product sums, not
// 32-product ones, so a block's mma cannot give them whole: here each block takes 8 int8 mmas
// (m16n8k16: 16 weight rows x 8 tokens over the block's half that holds lane l), mma l with the
// activations zeroed outside lane l's 4 columns, so that its result is exactly lane l's int32 for
// each of the 128 row/token pairs (k16 rather than k32: half the multiply-adds thrown away). The
// f32 part stays the CPU's: per pair and block one product of the scales, 8 fmas in block order,
// the same tree at the end (all within one thread, no shuffles). Against the dp4a kernels
// (staged_dots.cuh) this leaves ~2.7 instructions per lane sum instead of ~5 (counted in the
// source, not profiled) and keeps the weights
// in registers (one run of 4 blocks loaded ahead, the rows pulled into L2 first) rather than in
// shared memory; ptxas gives it ~250 registers, so 2 blocks per SM. Measured on the H100 it is
// faster for prompt-sized chunks and dense products of a batch, slower for a batch's few pairs per
// expert, so the default choice takes it by shape (MultiTokenQ8_0::kAuto, multi_token_kernels.h;
// docs/cuda.md "Multi-token kernels").
//
// The fast form (kExact false, MultiTokenQ8_0::kMmaFast) gives up the CPU's bits for one mma per
// block: the block's whole int32 sum, one chain acc = fma(d_w * d_a, sum, acc) per output over
// the blocks in order, no tree; ~130 registers instead of ~250.
//
// Fragments (PTX ISA, mma.m16n8k32 with .s8): thread (gid = lane / 4, tig = lane % 4) holds A's
// rows gid and gid + 8 at columns 4 tig..4 tig + 3 (registers 0, 1) and 16 + 4 tig.. (2, 3), B's
// column (token) gid at rows 4 tig.. and 16 + 4 tig.., and C's rows gid, gid + 8 at columns
// 2 tig, 2 tig + 1. m16n8k16 is its first half: A's registers 0, 1 and B's first (or, for
// columns 16..31, A's 2, 3 and B's second). In the device layout (device_layout.cuh) lane l's 4 quants of the 4 blocks of
// a run are 16 contiguous bytes, so thread tig loads lanes tig and tig + 4 of 4 blocks with two
// 16-byte loads per row, for weights and activations alike.
//
// Activations are staged in shared memory per block (MmaStageAct): up to kMmaTokens * tiles token
// rows, padded so that the 8 rows a warp reads at once start in different banks, then their f32
// block scales; absent tokens are zero rows (their sums are 0 and are not stored).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/multi_token_kernels.h"
#include "services/compute/cuda/staged_dots.cuh"
#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {

inline constexpr int kMmaTokens = 8;  // tokens per tile (the mma's n)
inline constexpr int kMmaRows = 16;   // weight rows per warp (the mma's m)

// Shared memory of MmaStageAct for n_tokens rows of `cols` (a multiple of 32) columns: quants at a
// row stride of 64 mod 128 bytes (the two tokens of a quarter warp's 16-byte loads fall in
// different halves of the banks), then the f32 scales, each token's row of them 16-byte aligned.
__host__ __device__ inline int64_t MmaActQuantStride(int64_t cols) { return (cols + 127) / 128 * 128 + 64; }
__host__ __device__ inline int64_t MmaActScaleStride(int64_t cols) {
  const int64_t s = (cols / 32 + 3) / 4 * 4;  // an odd multiple of 4 floats: tokens 2 apart 8 banks apart
  return s % 8 == 0 ? s + 4 : s;
}
__host__ __device__ inline int64_t MmaActSmemBytes(int64_t cols, int n_tokens) {
  return n_tokens *
         (MmaActQuantStride(cols) + MmaActScaleStride(cols) * 4 + 2 * sizeof(void*));  // + the rows' addresses
}
// Products the mma kernels take: Q8_0 rows of whole 32-blocks whose n_tokens staged rows fit in
// shared memory.
inline bool MmaQ8_0Fits(int type, int64_t cols, int n_tokens) {
  return type == kDevQ8_0 && cols % 32 == 0 && cols > 0 && MmaActSmemBytes(cols, n_tokens) <= kStagedMaxSmem;
}
// Tiles per pass for products of `cols` columns: the exact kernels' 2, or MmaFastTiles halved
// until its tokens fit in shared memory (down to 2, which MmaQ8_0Fits then decides).
inline constexpr int kMmaExactTiles = 2;
inline int MmaTilesFor(bool exact, int64_t cols) {
  int tiles = exact ? kMmaExactTiles : MmaFastTiles();
  while (tiles > 2 && MmaActSmemBytes(cols, tiles * kMmaTokens) > kStagedMaxSmem) tiles /= 2;
  return tiles;
}
// The tiles per pass with which the mma kernels take Q8_0 products of `cols` columns (MmaTilesFor),
// or 0 where the dp4a kernels take them: chosen (MultiTokenQ8_0::kDp4a), or the tokens' rows do
// not fit in shared memory.
inline int MmaTilesTaking(int type, int64_t cols) {
  if (MultiTokenQ8_0Kernels() == MultiTokenQ8_0::kDp4a) return 0;
  const int tiles = MmaTilesFor(MultiTokenQ8_0Exact(), cols);
  return MmaQ8_0Fits(type, cols, tiles * kMmaTokens) ? tiles : 0;
}
// Calls launch(kExact, kTiles) with the two as std::integral_constant, for the form and the tiles
// that MmaTilesFor gave: one instance of a kernel per form and tile count.
template <typename Launch>
void WithMmaForm(bool exact, int tiles, Launch launch) {
  if (exact) {
    launch(std::true_type{}, std::integral_constant<int, kMmaExactTiles>{});
    return;
  }
  switch (tiles) {
    case 8:
      launch(std::false_type{}, std::integral_constant<int, 8>{});
      break;
    case 4:
      launch(std::false_type{}, std::integral_constant<int, 4>{});
      break;
    default:
      launch(std::false_type{}, std::integral_constant<int, 2>{});
      break;
  }
}

// Copies n of n_slots token rows into shared memory with cp.async, zero rows after them;
// act_of(i, &q, &s) gives row i's quants and f32 scales (called by thread i). Every copy is issued
// before the first completes (one round trip, not one per row). Every thread of the block calls
// it; the caller syncs before (the previous rows are read by every warp) and after.
template <typename ActOf>
__device__ inline void MmaStageAct(uint8_t* smem, int64_t cols, int n_slots, int n, ActOf act_of) {
  const int64_t q_stride = MmaActQuantStride(cols), s_stride = MmaActScaleStride(cols);
  const int nb = static_cast<int>(cols / 32), chunks = static_cast<int>(cols / 16);
  float* scales = reinterpret_cast<float*>(smem + n_slots * q_stride);
  const uint8_t** q_of = reinterpret_cast<const uint8_t**>(scales + n_slots * s_stride);
  const float** s_of = reinterpret_cast<const float**>(q_of + n_slots);
  if (threadIdx.x < n_slots) {
    const uint8_t* q = nullptr;
    const float* s = nullptr;
    if (static_cast<int>(threadIdx.x) < n) act_of(static_cast<int>(threadIdx.x), &q, &s);
    q_of[threadIdx.x] = q;
    s_of[threadIdx.x] = s;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n_slots * chunks; idx += blockDim.x) {
    const int t = idx / chunks, c = idx % chunks;
    uint8_t* dst = smem + t * q_stride + c * 16;
    if (q_of[t] != nullptr)
      CpAsync16(dst, q_of[t] + c * 16);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
  for (int idx = threadIdx.x; idx < n_slots * nb; idx += blockDim.x) {
    const int t = idx / nb, b = idx % nb;
    if (s_of[t] != nullptr)
      CpAsync4(scales + t * s_stride + b, s_of[t] + b);
    else
      scales[t * s_stride + b] = 0.0f;
  }
  CpAsyncWaitAll();
}

// One int8 mma: c[i] = 1.5 * 2^23's bit pattern + the int32 sum of row/column i of the fragment
// (|sum| < 2^22: at most 32 products of quants in [-127, 127], 516,128), so that MmaSumF32 gets
// the sum as an f32 with one exact subtraction instead of a conversion.
__device__ __forceinline__ void MmaS8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
  constexpr int kBias = 0x4B400000;  // the f32 12582912 = 1.5 * 2^23
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(kBias));
}
// The same over 16 columns (m16n8k16): A's rows gid, gid + 8 and B's token gid at columns
// 4 tig..4 tig + 3 of the half.
__device__ __forceinline__ void MmaS8K16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  constexpr int kBias = 0x4B400000;
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(kBias));
}
__device__ __forceinline__ float MmaSumF32(int biased) { return __fsub_rn(__int_as_float(biased), 12582912.0f); }

// One 32-block for one tile of 8 tokens: w* the weights of rows gid / gid + 8 at lanes tig (lo)
// and tig + 4 (hi), x* token gid's at the same lanes, ws* the rows' scales, s* tokens 2 tig and
// 2 tig + 1's. kExact: acc[l][i] is lane l's chain of C element i (8 mmas, each with the
// activations of one lane's 4 columns); otherwise acc[0][i] is C element i's one chain (one mma
// over the whole block).
template <bool kExact>
__device__ __forceinline__ void MmaQ8_0Block(uint32_t w_lo0, uint32_t w_lo8, uint32_t w_hi0, uint32_t w_hi8,
                                             uint32_t x_lo, uint32_t x_hi, float ws0, float ws8, float s_t0, float s_t1,
                                             int tig, float (&acc)[kExact ? 8 : 1][4]) {
  const float d[4] = {__fmul_rn(ws0, s_t0), __fmul_rn(ws0, s_t1), __fmul_rn(ws8, s_t0), __fmul_rn(ws8, s_t1)};
  if constexpr (!kExact) {  // the whole block in one mma
    int c[4];
    MmaS8(c, w_lo0, w_lo8, w_hi0, w_hi8, x_lo, x_hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[0][i] = fmaf(d[i], MmaSumF32(c[i]), acc[0][i]);
  } else {
#pragma unroll
    for (int l = 0; l < 8; ++l) {
      // Only lane l's 4 columns of the block, in the half that holds them: thread tig holds
      // lanes tig (x_lo) and tig + 4 (x_hi).
      int c[4];
      if (l < 4)
        MmaS8K16(c, w_lo0, w_lo8, tig == l ? x_lo : 0u);
      else
        MmaS8K16(c, w_hi0, w_hi8, tig == l - 4 ? x_hi : 0u);
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[l][i] = fmaf(d[i], MmaSumF32(c[i]), acc[l][i]);
    }
  }
}

// The dots of a warp's 16 rows (lo: row gid, hi: row gid + 8 of this thread; q == nullptr: a zero
// row) with the first n_tiles tiles of the staged tokens. out[tile][i]: C element i (rows gid,
// gid, gid + 8, gid + 8; tokens 2 tig, 2 tig + 1, 2 tig, 2 tig + 1 of the tile), the CPU's sum.
// Every lane of the warp calls it (the mma is warp-wide), with a warp-uniform n_tiles. kExact: the
// CPU's sum bit for bit; otherwise one chain per output (MultiTokenQ8_0::kMmaFast, multi_token_kernels.h).
template <int kTiles, bool kExact>
__device__ inline void MmaQ8_0Dots(const RowRef& lo, const RowRef& hi, int64_t cols, const uint8_t* smem, int n_slots,
                                   int n_tiles, float (&out)[kTiles][4]) {
  const int lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int64_t q_stride = MmaActQuantStride(cols), s_stride = MmaActScaleStride(cols);
  const float* scales = reinterpret_cast<const float*>(smem + n_slots * q_stride);
  const int nb = static_cast<int>(cols / 32), nr = nb / 4;
  const bool aligned = nb % 4 == 0;  // a run's 4 weight scales are one 8-byte load
  constexpr int kChains = kExact ? 8 : 1;
  float acc[kTiles][kChains][4];
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int l = 0; l < kChains; ++l)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][l][i] = 0.0f;

  // Runs of 4 blocks in the interleaved layout; the next run's weights are loaded before this
  // run's products.
  const auto load_row = [&](const RowRef& r, int i, uint4& w_lo, uint4& w_hi, float(&ws)[4]) {
    if (r.q == nullptr || i >= nr) {
      w_lo = w_hi = make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) ws[j] = 0.0f;
      return;
    }
    const uint4* run = reinterpret_cast<const uint4*>(r.q + int64_t(i) * 128);
    w_lo = __ldg(run + tig);      // lane tig: columns 4 tig.. of each block
    w_hi = __ldg(run + 4 + tig);  // lane tig + 4: columns 16 + 4 tig..
    if (aligned) {
      Q8_0RunScales(__ldg(reinterpret_cast<const uint2*>(r.s + 4 * i)), ws);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) ws[j] = __half2float(r.s[4 * i + j]);
    }
  };
  // w: rows gid and gid + 8 at lane tig, then at lane tig + 4 (the mma's A registers 0..3).
  const auto load = [&](int i, uint4(&w)[4], float(&ws)[2][4]) {
    load_row(lo, i, w[0], w[2], ws[0]);
    load_row(hi, i, w[1], w[3], ws[1]);
  };
  uint4 w[4];
  float ws[2][4];
  load(0, w, ws);
  for (int i = 0; i < nr; ++i) {
    uint4 w_next[4];
    float ws_next[2][4];
    load(i + 1, w_next, ws_next);
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      if (t >= n_tiles) break;  // warp-uniform
      const uint8_t* x_row = smem + (t * kMmaTokens + gid) * q_stride + int64_t(i) * 128;
      const uint4 x_lo = *reinterpret_cast<const uint4*>(x_row + 16 * tig);
      const uint4 x_hi = *reinterpret_cast<const uint4*>(x_row + 64 + 16 * tig);
      const float4 s0 = *reinterpret_cast<const float4*>(scales + (t * kMmaTokens + 2 * tig) * s_stride + 4 * i);
      const float4 s1 = *reinterpret_cast<const float4*>(scales + (t * kMmaTokens + 2 * tig + 1) * s_stride + 4 * i);
      const float st0[4] = {s0.x, s0.y, s0.z, s0.w}, st1[4] = {s1.x, s1.y, s1.z, s1.w};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        MmaQ8_0Block<kExact>(Word(w[0], j), Word(w[1], j), Word(w[2], j), Word(w[3], j), Word(x_lo, j), Word(x_hi, j),
                             ws[0][j], ws[1][j], st0[j], st1[j], tig, acc[t]);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = w_next[k];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int j = 0; j < 4; ++j) ws[m][j] = ws_next[m][j];
  }
  // Blocks past the last run of 4: plain layout, lane l's 4 quants at 4 l.
  for (int b = 4 * nr; b < nb; ++b) {
    const auto word = [&](const RowRef& r, int off) {
      return r.q != nullptr ? __ldg(reinterpret_cast<const uint32_t*>(r.q + int64_t(b) * 32 + off)) : 0u;
    };
    const uint32_t w_lo0 = word(lo, 4 * tig), w_lo8 = word(hi, 4 * tig);
    const uint32_t w_hi0 = word(lo, 16 + 4 * tig), w_hi8 = word(hi, 16 + 4 * tig);
    const float ws0 = lo.q != nullptr ? __half2float(lo.s[b]) : 0.0f;
    const float ws8 = hi.q != nullptr ? __half2float(hi.s[b]) : 0.0f;
#pragma unroll
    for (int t = 0; t < kTiles; ++t) {
      if (t >= n_tiles) break;
      const uint8_t* x_row = smem + (t * kMmaTokens + gid) * q_stride + int64_t(b) * 32;
      const uint32_t x_lo = *reinterpret_cast<const uint32_t*>(x_row + 4 * tig);
      const uint32_t x_hi = *reinterpret_cast<const uint32_t*>(x_row + 16 + 4 * tig);
      const float s_t0 = scales[(t * kMmaTokens + 2 * tig) * s_stride + b];
      const float s_t1 = scales[(t * kMmaTokens + 2 * tig + 1) * s_stride + b];
      MmaQ8_0Block<kExact>(w_lo0, w_lo8, w_hi0, w_hi8, x_lo, x_hi, ws0, ws8, s_t0, s_t1, tig, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float(&v)[kChains][4] = acc[t];
      if constexpr (kExact) {
        out[t][i] = __fadd_rn(__fadd_rn(__fadd_rn(v[0][i], v[4][i]), __fadd_rn(v[2][i], v[6][i])),
                              __fadd_rn(__fadd_rn(v[1][i], v[5][i]), __fadd_rn(v[3][i], v[7][i])));
      } else {
        out[t][i] = v[0][i];
      }
    }
}

}  // namespace mer::cuda
