// The fast form's multi-token Q4_K, Q5_K and Q6_K products (MultiTokenQ8_0::kMmaFast) on the tensor
// cores, in shared-memory tiles shaped as mma_q8_0_tiles.cuh's: a block of 4 warps takes 64 weight
// rows x kBN tokens of Q8_K activations, and both pass through shared memory a 256-block of columns
// at a time, several blocks in flight (cp.async); a warp computes 32 rows x kBN / 2 tokens from
// shared memory. The arithmetic (an mma per sub-block, then the block's exact integer sums and one
// f32 chain per output) is mma_kquant.cuh's; the accumulators and ForEachTileOutput are the Q8_0
// tiles'.
//
// A staged block's place in shared memory is KQuantTileLayout's (mma_kquant.cuh). Q6_K's f16 d
// (2-byte aligned in the layout, which cp.async cannot copy) is read from global memory as the
// block is computed.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/mma_kquant.cuh"
#include "services/compute/cuda/mma_q8_0_tiles.cuh"
#include "services/compute/cuda/multi_token_kernels.h"

namespace mer::cuda {

// A tile's shared memory: the pointer header, then kStages buffers of KQuantTileLayout.
template <int kType, int kBN>
struct KQuantTileSmem : KQuantTileLayout<kType, kBN> {
  using L = KQuantTileLayout<kType, kBN>;
  static constexpr int kNTiles = kBN / 16;  // n-tiles of 8 tokens per warp
  static constexpr int kPointerBytes = (4 * kMmaTileRows + 3 * kBN) * static_cast<int>(sizeof(void*));
  // Blocks in flight: two of Q6_K's 64-token buffers (39 KB each) leave room for a second block
  // per SM, three would not.
  static constexpr int kStages = L::kQ6 && kBN == 64 ? 2 : 3;
  static constexpr int kBytes = kPointerBytes + kStages * L::kBufferBytes;
  static_assert(L::kRows == kMmaTileRows, "the layout's rows are the tile's");

  // Each mma row's qs / ql, header / scales, qh (Q5_K, Q6_K) and f16 d (Q6_K), of its first
  // block; each token's quants, bsums and d (nullptr: zero).
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

  // The start (block 0) of a copy's row or token part (KQuantTileLayout::Copy), or nullptr.
  __device__ const uint8_t* Source(typename L::Part part, int index) const {
    switch (part) {
      case L::kRowQs:
        return row_q[index];
      case L::kRowQh:
        return row_qh[index];
      case L::kRowHeader:
        return row_h[index];
      case L::kTokQuants:
        return tok_q[index];
      default:
        return tok_bs[index];
    }
  }
};

// Issues the copies of block i of every row and token into `buffer` (KQuantTileLayout::CopyOf).
template <int kType, int kBN>
__device__ inline void KQuantTileStage(const KQuantTileSmem<kType, kBN>& s, uint8_t* buffer, int i) {
  using L = KQuantTileLayout<kType, kBN>;
  for (int idx = threadIdx.x; idx < L::kCopies; idx += kMmaTileThreads) {
    const typename L::Copy c = L::CopyOf(idx, i);
    const uint8_t* src = s.Source(c.part, c.index);
    if (src != nullptr)
      CpAsync16(buffer + c.dst, src + c.src);
    else
      *reinterpret_cast<uint4*>(buffer + c.dst) = make_uint4(0, 0, 0, 0);
  }
  for (int t = threadIdx.x; t < kBN; t += kMmaTileThreads) {
    uint8_t* dst = buffer + L::D(t);
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
  // qh[mt] the same of Q6_K's qh, qh5[mt] of Q5_K's.
  uint4 q[2][4], header[2][2];
  uint2 qh[2][4];
  uint32_t qh5[2][4];
  float d[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int r[2] = {row_base + mt * 16 + gid, row_base + mt * 16 + gid + 8};
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // k: row r[k % 2] at lane tig + 4 (k / 2)
      q[mt][k] = *reinterpret_cast<const uint4*>(buffer + S::Qs(r[k % 2], tig + 4 * (k / 2)));
      if constexpr (S::kQ6) qh[mt][k] = *reinterpret_cast<const uint2*>(buffer + S::Qh(r[k % 2], tig + 4 * (k / 2)));
      if constexpr (S::kQ5)
        qh5[mt][k] = *reinterpret_cast<const uint32_t*>(buffer + S::Qh(r[k % 2], tig + 4 * (k / 2)));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      header[mt][h] = *reinterpret_cast<const uint4*>(buffer + S::Header(r[h]));
      if constexpr (S::kQ6)
        d[mt][h] = s.row_d[r[h]] != nullptr ? __half2float(s.row_d[r[h]][i]) : 0.0f;
      else
        d[mt][h] = __low2float(*reinterpret_cast<const __half2*>(&header[mt][h].x));
    }
  }
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
    const int t = tok_base + nt * 8;
    // Token gid's words of lanes tig (x[0], x[1]: groups 0..3, 4..7) and tig + 4 (x[2], x[3]).
    uint4 x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      x[k] = *reinterpret_cast<const uint4*>(buffer + S::Quants(t + gid, tig + 4 * (k / 2), k % 2));
    // This thread's output tokens t + 2 tig and t + 2 tig + 1: their d and bsums.
    float d_a[2];
    uint4 bs[2][2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int tok = t + 2 * tig + k;
      d_a[k] = *reinterpret_cast<const float*>(buffer + S::D(tok));
      bs[k][0] = *reinterpret_cast<const uint4*>(buffer + S::Bsums(tok));
      bs[k][1] = *reinterpret_cast<const uint4*>(buffer + S::Bsums(tok) + 16);
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
            isum[c] += ByteS(Word(sc, G / 2), 2 * (G % 2)) * lo[c] + ByteS(Word(sc, G / 2), 2 * (G % 2) + 1) * hi[c];
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
          // Rows gid, gid + 8 at lane tig, then at lane tig + 4: their codes of sub-block g.
          uint32_t a[4];
#pragma unroll
          for (int k = 0; k < 4; ++k)
            a[k] = S::kQ5 ? Q5_KSubBlockCodes(q[mt][k], qh5[mt][k], g) : Q4_KSubBlockCodes(q[mt][k], g);
          int c4[4];
          MmaS8Int(c4, a[0], a[1], a[2], a[3], Q8_KSubBlockQuants(x[0], x[1], g), Q8_KSubBlockQuants(x[2], x[3], g));
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
    } else if constexpr (kType == kDevQ5_K) {
      s.row_q[m] = row ? w.data + Q5_KQsOffset(b, 0) : nullptr;
      s.row_h[m] = row ? w.data + Q5_KHeaderOffset(n, b) : nullptr;
      s.row_qh[m] = row ? w.data + Q5_KQhOffset(n, b, 0) : nullptr;
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

// Products the K-quant tiles take: Q4_K, Q5_K or Q6_K rows and Q8_K activations of whole blocks (their
// rows, bsums and the staged copies then 16-byte aligned).
inline bool KQuantTilesFit(int type, int64_t cols, int64_t act_stride) {
  return (type == kDevQ4_K || type == kDevQ5_K || type == kDevQ6_K) && cols > 0 && cols % kKBlock == 0 &&
         act_stride % kKBlock == 0;
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
  } else if (type == kDevQ5_K) {
    if (kBN == 64)
      launch(KQuantTiles<kDevQ5_K, 64>{});
    else
      launch(KQuantTiles<kDevQ5_K, 32>{});
  } else {
    if (kBN == 64)
      launch(KQuantTiles<kDevQ4_K, 64>{});
    else
      launch(KQuantTiles<kDevQ4_K, 32>{});
  }
}

}  // namespace mer::cuda
