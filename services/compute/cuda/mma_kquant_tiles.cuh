// The fast form's multi-token Q4_K and Q6_K products (MultiTokenQ8_0::kMmaFast) on the tensor
// cores, in shared-memory tiles shaped as mma_q8_0_tiles.cuh's: a block of 4 warps takes 64 weight
// rows x kBN tokens of Q8_K activations, and both pass through shared memory a 256-block of columns
// at a time, several blocks in flight (cp.async); a warp computes 32 rows x kBN / 2 tokens from
// shared memory. The arithmetic (an mma per sub-block, then the block's exact integer sums and one
// f32 chain per output) is mma_kquant.cuh's; the accumulators and ForEachTileOutput are the Q8_0
// tiles'.
//
// A staged block: each row's 128 qs (Q4_K) or ql (Q6_K) bytes in the device layout (lane i's 16
// bytes at 16i) at a stride of 192 bytes, so that the 16-byte loads of a quarter warp's two rows
// fall in different halves of the banks; Q6_K's 64 qh bytes (lane i's 8 at 8i) at a stride of 96
// (a half warp's 4 rows in 4 quarters of the banks); each row's 16 header (Q4_K: d, dmin, the 12
// scale bytes) or scale (Q6_K) bytes; each token's 256 quants in the Q8_K layout (lane i's 32
// bytes at 32i) at a stride of 272, its 16 bsums and its f32 d. Q6_K's f16 d (2-byte aligned in the
// layout, which cp.async cannot copy) is read from global memory as the block is computed.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/mma_kquant.cuh"
#include "services/compute/cuda/mma_q8_0_tiles.cuh"
#include "services/compute/cuda/multi_token_kernels.h"

namespace mer::cuda {

template <int kType, int kBN>
struct KQuantTileSmem {
  static_assert(kType == kDevQ4_K || kType == kDevQ6_K, "tiled K-quant types");
  static_assert(kBN == 32 || kBN == 64, "tokens per tile");
  static constexpr bool kQ6 = kType == kDevQ6_K;
  static constexpr int kNTiles = kBN / 16;  // n-tiles of 8 tokens per warp
  static constexpr int kRowStride = 192, kQhStride = 96, kTokStride = 272;
  static constexpr int kQhOffset = kMmaTileRows * kRowStride;
  static constexpr int kHeaderOffset = kQhOffset + (kQ6 ? kMmaTileRows * kQhStride : 0);
  static constexpr int kTokOffset = kHeaderOffset + kMmaTileRows * 16;
  static constexpr int kBsumsOffset = kTokOffset + kBN * kTokStride;
  static constexpr int kDOffset = kBsumsOffset + kBN * 32;
  static constexpr int kBufferBytes = kDOffset + kBN * 4;
  static constexpr int kPointerBytes = (4 * kMmaTileRows + 3 * kBN) * static_cast<int>(sizeof(void*));
  // Blocks in flight: two of Q6_K's 64-token buffers (39 KB each) leave room for a second block
  // per SM, three would not.
  static constexpr int kStages = kQ6 && kBN == 64 ? 2 : 3;
  static constexpr int kBytes = kPointerBytes + kStages * kBufferBytes;

  // Each mma row's qs / ql, header / scales, and (Q6_K) qh and f16 d, of its first block; each
  // token's quants, bsums and d (nullptr: zero).
  const uint8_t** row_q;
  const uint8_t** row_h;
  const uint8_t** row_qh;
  const __half** row_d;
  const uint8_t** tok_q;
  const uint8_t** tok_bs;
  const float** tok_d;
  uint8_t* buffers;

  __device__ explicit KQuantTileSmem(uint8_t* smem)
      : row_q(reinterpret_cast<const uint8_t**>(smem)),
        row_h(row_q + kMmaTileRows),
        row_qh(row_h + kMmaTileRows),
        row_d(reinterpret_cast<const __half**>(row_qh + kMmaTileRows)),
        tok_q(reinterpret_cast<const uint8_t**>(row_d + kMmaTileRows)),
        tok_bs(tok_q + kBN),
        tok_d(reinterpret_cast<const float**>(tok_bs + kBN)),
        buffers(smem + kPointerBytes) {}
};

// Copies 16-byte chunk c of block i (bytes_per_block apart) of src to dst, or zeroes dst.
__device__ inline void StageChunk(uint8_t* dst, const uint8_t* src, int i, int bytes_per_block, int c) {
  if (src != nullptr)
    CpAsync16(dst, src + int64_t(i) * bytes_per_block + c * 16);
  else
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
}

// Issues the copies of block i of every row and token into `buffer`.
template <int kType, int kBN>
__device__ inline void KQuantTileStage(const KQuantTileSmem<kType, kBN>& s, uint8_t* buffer, int i) {
  using S = KQuantTileSmem<kType, kBN>;
  // 16-byte chunks: the rows' qs / ql (8 a row), qh (4), header / scales (1); the tokens' quants
  // (16), bsums (2).
  constexpr int kQ = kMmaTileRows * 8, kQh = S::kQ6 ? kMmaTileRows * 4 : 0, kH = kMmaTileRows;
  constexpr int kTq = kBN * 16, kTb = kBN * 2;
  for (int idx = threadIdx.x; idx < kQ + kQh + kH + kTq + kTb; idx += kMmaTileThreads) {
    if (idx < kQ) {
      StageChunk(buffer + (idx / 8) * S::kRowStride + (idx % 8) * 16, s.row_q[idx / 8], i, 128, idx % 8);
    } else if (const int j = idx - kQ; j < kQh) {
      StageChunk(buffer + S::kQhOffset + (j / 4) * S::kQhStride + (j % 4) * 16, s.row_qh[j / 4], i, 64, j % 4);
    } else if (const int h = j - kQh; h < kH) {
      StageChunk(buffer + S::kHeaderOffset + h * 16, s.row_h[h], i, 16, 0);
    } else if (const int t = h - kH; t < kTq) {
      StageChunk(buffer + S::kTokOffset + (t / 16) * S::kTokStride + (t % 16) * 16, s.tok_q[t / 16], i, kKBlock,
                 t % 16);
    } else {
      const int b = t - kTq;
      StageChunk(buffer + S::kBsumsOffset + b * 16, s.tok_bs[b / 2], i, 32, b % 2);
    }
  }
  for (int t = threadIdx.x; t < kBN; t += kMmaTileThreads) {
    uint8_t* dst = buffer + S::kDOffset + t * 4;
    if (s.tok_d[t] != nullptr)
      CpAsync4(dst, s.tok_d[t] + i);
    else
      *reinterpret_cast<float*>(dst) = 0.0f;
  }
}

// s8 x s8 mmas into zeroed int32 accumulators (no bias: the sums stay integers): m16n8k32, and
// m16n8k16 (A rows gid, gid + 8 and B's token gid at columns 4 tig .. 4 tig + 3).
__device__ __forceinline__ void MmaS8Int(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void MmaS8K16Int(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

// The products of staged block i for this warp's rows and tokens, added to acc.
template <int kType, int kBN>
__device__ inline void KQuantTileBlock(const KQuantTileSmem<kType, kBN>& s, const uint8_t* buffer, int i,
                                       float (&acc)[2][kBN / 16][1][4]) {
  using S = KQuantTileSmem<kType, kBN>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int row_base = (warp / 2) * 32, tok_base = (warp % 2) * (kBN / 2);
  // q[mt]: rows gid and gid + 8 of m-tile mt at lane tig, then at lane tig + 4 (the A registers);
  // qh[mt] the same of Q6_K's qh.
  uint4 q[2][4], header[2][2];
  uint2 qh[2][4];
  float d[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int r[2] = {row_base + mt * 16 + gid, row_base + mt * 16 + gid + 8};
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // k: row r[k % 2] at lane tig + 4 (k / 2)
      q[mt][k] = *reinterpret_cast<const uint4*>(buffer + r[k % 2] * S::kRowStride + 64 * (k / 2) + 16 * tig);
      if constexpr (S::kQ6)
        qh[mt][k] =
            *reinterpret_cast<const uint2*>(buffer + S::kQhOffset + r[k % 2] * S::kQhStride + 32 * (k / 2) + 8 * tig);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      header[mt][h] = *reinterpret_cast<const uint4*>(buffer + S::kHeaderOffset + r[h] * 16);
      if constexpr (S::kQ6)
        d[mt][h] = s.row_d[r[h]] != nullptr ? __half2float(s.row_d[r[h]][i]) : 0.0f;
      else
        d[mt][h] = __low2float(*reinterpret_cast<const __half2*>(&header[mt][h].x));
    }
  }
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
    const int t = tok_base + nt * 8;
    const uint8_t* x_row = buffer + S::kTokOffset + (t + gid) * S::kTokStride;
    // Token gid's words of lanes tig (x[0], x[1]: groups 0..3, 4..7) and tig + 4 (x[2], x[3]).
    uint4 x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = *reinterpret_cast<const uint4*>(x_row + 128 * (k / 2) + 32 * tig + 16 * (k % 2));
    // This thread's output tokens t + 2 tig and t + 2 tig + 1: their d and bsums.
    float d_a[2];
    uint4 bs[2][2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int tok = t + 2 * tig + k;
      d_a[k] = *reinterpret_cast<const float*>(buffer + S::kDOffset + tok * 4);
      bs[k][0] = *reinterpret_cast<const uint4*>(buffer + S::kBsumsOffset + tok * 32);
      bs[k][1] = *reinterpret_cast<const uint4*>(buffer + S::kBsumsOffset + tok * 32 + 16);
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      int isum[4] = {0, 0, 0, 0};  // C element c: row gid (+ 8 for c >= 2), token 2 tig + c % 2
      if constexpr (S::kQ6) {
#pragma unroll
        for (int G = 0; G < 8; ++G) {
          int lo[4], hi[4];  // sub-blocks 2G (lanes 0..3 of the group) and 2G + 1 (lanes 4..7)
          MmaS8K16Int(lo, Q6_KGroupCodes(q[mt][0], qh[mt][0], G), Q6_KGroupCodes(q[mt][1], qh[mt][1], G),
                      Q8_KSubBlockQuants(x[0], x[1], G));
          MmaS8K16Int(hi, Q6_KGroupCodes(q[mt][2], qh[mt][2], G), Q6_KGroupCodes(q[mt][3], qh[mt][3], G),
                      Q8_KSubBlockQuants(x[2], x[3], G));
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const uint4& sc = header[mt][c / 2];
            isum[c] +=
                ByteS(LaneWord(sc, G / 2), 2 * (G % 2)) * lo[c] + ByteS(LaneWord(sc, G / 2), 2 * (G % 2) + 1) * hi[c];
          }
        }
#pragma unroll
        for (int c = 0; c < 4; ++c)
          acc[mt][nt][0][c] =
              Q6_KTileStep(acc[mt][nt][0][c], isum[c], Q6_KOffsetSum(header[mt][c / 2], bs[c % 2][0], bs[c % 2][1]),
                           d[mt][c / 2], d_a[c % 2]);
      } else {
        const Q4_KScales sc[2] = {DecodeQ4_KScales(header[mt][0]), DecodeQ4_KScales(header[mt][1])};
#pragma unroll
        for (int g = 0; g < 8; ++g) {
          int c4[4];
          MmaS8Int(c4, Q4_KSubBlockCodes(q[mt][0], g), Q4_KSubBlockCodes(q[mt][1], g), Q4_KSubBlockCodes(q[mt][2], g),
                   Q4_KSubBlockCodes(q[mt][3], g), Q8_KSubBlockQuants(x[0], x[1], g),
                   Q8_KSubBlockQuants(x[2], x[3], g));
#pragma unroll
          for (int c = 0; c < 4; ++c) isum[c] += Q4_KSubBlockScale(sc[c / 2], g) * c4[c];
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float dmin = __high2float(*reinterpret_cast<const __half2*>(&header[mt][c / 2].x));
          acc[mt][nt][0][c] =
              Q4_KTileStep(acc[mt][nt][0][c], isum[c], Q5_KMinSum(sc[c / 2], bs[c % 2][0], bs[c % 2][1]), d[mt][c / 2],
                           dmin, d_a[c % 2]);
        }
      }
    }
  }
}

// The block's 64 x kBN products over `cols` columns (a multiple of 256) of the rows and tokens in
// the header, in MmaTileDots's accumulator layout (ForEachTileOutput). Every thread of the block
// calls it after the header is written and a __syncthreads; it returns after a __syncthreads.
template <int kType, int kBN>
__device__ inline void KQuantTileDots(const KQuantTileSmem<kType, kBN>& s, int64_t cols,
                                      float (&acc)[2][kBN / 16][1][4]) {
  using S = KQuantTileSmem<kType, kBN>;
  ZeroTile<kBN>(acc);
  PipelineSteps<S::kStages, S::kBufferBytes>(
      s.buffers, static_cast<int>(cols / kKBlock), [&](uint8_t* buffer, int i) { KQuantTileStage(s, buffer, i); },
      [&](const uint8_t* buffer, int i) { KQuantTileBlock(s, buffer, i, acc); });
}

// The K-quant tiles for the kernels of mma_tile_kernels.cuh (Q8_0Tiles's interface).
template <int kType, int kBN_>
struct KQuantTiles {
  static constexpr int kBN = kBN_;
  using Smem = KQuantTileSmem<kType, kBN>;
  static constexpr int kBytes = Smem::kBytes;
  // Blocks per SM, the kernels' launch bounds: 2 (at 3, <= 168 registers, ptxas spills the Q4_K
  // 32-token tiles; the other tiles' shared memory fits only 2).
  static constexpr int kExpertBlocksPerSm = 2;
  static constexpr int kMatvecBlocksPerSm = kExpertBlocksPerSm;
  __device__ static void SetRow(const Smem& s, int m, const DevMatrix& w, int64_t r) {
    const int64_t nb = w.cols / kKBlock, n = w.rows * nb, b = r * nb;
    const bool row = r >= 0;
    if constexpr (kType == kDevQ4_K) {
      s.row_q[m] = row ? w.data + Q4_KQsOffset(b, 0) : nullptr;
      s.row_h[m] = row ? w.data + Q4_KHeaderOffset(n, b) : nullptr;
      s.row_qh[m] = nullptr;
      s.row_d[m] = nullptr;
    } else {
      s.row_q[m] = row ? w.data + Q6_KQlOffset(b, 0) : nullptr;
      s.row_h[m] = row ? w.data + Q6_KScalesOffset(n, b) : nullptr;
      s.row_qh[m] = row ? w.data + Q6_KQhOffset(n, b, 0) : nullptr;
      s.row_d[m] = row ? reinterpret_cast<const __half*>(w.data + Q6_KDOffset(n, b)) : nullptr;
    }
  }
  __device__ static void SetToken(const Smem& s, int i, const DevAct& act, int64_t t) {
    const uint8_t* row = t >= 0 ? act.data + t * Q8_KRowBytes(act.stride) : nullptr;
    s.tok_q[i] = row;
    s.tok_bs[i] = t >= 0 ? row + Q8_KBsumsOffset(act.stride, 0) : nullptr;
    s.tok_d[i] = t >= 0 ? act.scales + t * (act.stride / kKBlock) : nullptr;
  }
  __device__ static void Dots(const Smem& s, int64_t cols, float (&acc)[2][kBN / 16][1][4]) {
    KQuantTileDots(s, cols, acc);
  }
};

// Products the K-quant tiles take: Q4_K or Q6_K rows and Q8_K activations of whole blocks (their
// rows, bsums and the staged copies then 16-byte aligned).
inline bool KQuantTilesFit(int type, int64_t cols, int64_t act_stride) {
  return (type == kDevQ4_K || type == kDevQ6_K) && cols > 0 && cols % kKBlock == 0 && act_stride % kKBlock == 0;
}

// Tokens per tile where the K-quant tiles take a product of several tokens whose row blocks see
// `tokens` tokens each (on average), else 0 (the dp4a kernels, the CPU's bits): the fast form only
// (MultiTokenQ8_0::kMmaFast) with these tiles enabled (KQuantTilesEnabled), its tiles not turned off
// (FastTiles), rows and activations that fit.
inline int KQuantTileTokens(int type, int64_t cols, int64_t act_stride, int64_t tokens) {
  if (MultiTokenQ8_0Kernels() != MultiTokenQ8_0::kMmaFast || !KQuantTilesEnabled() ||
      FastTilesChoice() == FastTiles::kOff || !KQuantTilesFit(type, cols, act_stride))
    return 0;
  return MmaTileTokens(tokens);
}

// Calls launch(KQuantTiles<type, kBN>{}) for a tiled type (KQuantTilesFit) and kBN of 32 or 64.
template <typename Launch>
void WithKQuantTiles(int type, int kBN, Launch launch) {
  if (type == kDevQ6_K) {
    if (kBN == 64)
      launch(KQuantTiles<kDevQ6_K, 64>{});
    else
      launch(KQuantTiles<kDevQ6_K, 32>{});
  } else {
    if (kBN == 64)
      launch(KQuantTiles<kDevQ4_K, 64>{});
    else
      launch(KQuantTiles<kDevQ4_K, 32>{});
  }
}

}  // namespace mer::cuda
