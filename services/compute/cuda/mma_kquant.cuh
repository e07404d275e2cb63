// The arithmetic of the fast form's multi-token Q4_K, Q5_K and Q6_K products on the tensor cores
// (mma_kquant_tiles.cuh), free of device intrinsics outside Dot2 so that a host test
// (tests/unit/compute/kquant_layout_test.cc) can drive a warp's mma fragments through it against
// the CPU kernels.
//
// Q4_K: per 32-element sub-block g of a 256-block, one int8 mma.m16n8k32 gives every (row, token)
// the integer sum S_g of the row's codes (0..15) times the token's Q8_K quants. The block's integer
// sums are then exact int32s:
//   isum = sum_g sc[g] * S_g,  msum = sum_g m[g] * (bsums[2g] + bsums[2g + 1])   (Q5_KMinSum)
// and each output is one f32 chain over its row's blocks in order (Q4_KTileStep). Q5_K: the same
// with codes 0..31 (the fifth bit from qh).
// Q6_K: per 16-element sub-block j, one mma.m16n8k16 over the codes (0..63; the -32 offset is taken
// out once per block, as the CPU does); isum = sum_j sc[j] * S_j - 32 * sum_j sc[j] * bsums[j],
// and acc = fma(d * d_a, isum, acc).
// The CPU (q4_k_rows.cc, q5_k_rows.cc, q6_k_rows.cc) keeps 8 lane sums per block and a tree instead of one sum,
// so the results differ from its in the last bits of each product, as the fast Q8_0 kernels' do
// (multi_token_kernels.h).
//
// The mma's k index 4q + j is element 4q + j of the 32 elements of a group. Q8_K (kquant_layout.cuh)
// holds elements 4i .. 4i + 3 of group g in word g of lane i's 32 bytes; Q4_K and Q5_K hold those of
// sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles) in word c of lane i's 16 qs bytes (Q5_K's
// fifth bits in bit g of the bytes of lane i's qh word); Q6_K
// holds those of group 4h + k in lane i's ql word 2h + k % 2 (nibble k / 2) and qh word h (bits
// 2k, 2k + 1 of each byte). So thread tig's A registers (k = 4 tig .. +3 and 16 + 4 tig .. +3) are
// its rows' words of lanes tig and tig + 4, its B registers token gid's words of the same lanes;
// for Q6_K lanes 0..3 of a group are its first 16-element sub-block, lanes 4..7 its second.
#pragma once

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/kquant_layout.cuh"

namespace mer::cuda {

// Sub-block g's codes of elements 4i .. 4i + 3, one per byte, from lane i's 16 qs bytes.
__host__ __device__ inline uint32_t Q4_KSubBlockCodes(const uint4& lane_qs, int g) {
  return (Word(lane_qs, g / 2) >> (4 * (g % 2))) & 0x0f0f0f0fu;
}

// Q5_K: the same with each code's fifth bit from lane i's qh word (bit g of each byte).
__host__ __device__ inline uint32_t Q5_KSubBlockCodes(const uint4& lane_qs, uint32_t lane_qh, int g) {
  return Q4_KSubBlockCodes(lane_qs, g) | (((lane_qh >> g) & 0x01010101u) << 4);
}

// Sub-block g's quants of elements 4i .. 4i + 3 from lane i's 32 Q8_K bytes (lo: groups 0..3,
// hi: groups 4..7).
__host__ __device__ inline uint32_t Q8_KSubBlockQuants(const uint4& lo, const uint4& hi, int g) {
  return g < 4 ? Word(lo, g) : Word(hi, g - 4);
}

// Sub-block g's 6-bit scale.
__host__ __device__ inline int Q4_KSubBlockScale(const Q4_KScales& s, int g) {
  return ByteU(g < 4 ? s.sc_lo : s.sc_hi, g % 4);
}

// One block of one output's chain: d, dmin the row's f32 scales, d_a the token's.
__host__ __device__ inline float Q4_KTileStep(float acc, int isum, int msum, float d, float dmin, float d_a) {
  acc = fmaf(d * d_a, static_cast<float>(isum), acc);
  return fmaf(-(dmin * d_a), static_cast<float>(msum), acc);
}

// Q6_K: group G's codes of elements 4i .. 4i + 3, one per byte (0..63), from lane i's ql and qh
// words.
__host__ __device__ inline uint32_t Q6_KGroupCodes(const uint4& lane_ql, const uint2& lane_qh, int G) {
  const int h = G / 4, k = G % 4;
  const uint32_t ql = Word(lane_ql, 2 * h + k % 2), qh = h == 0 ? lane_qh.x : lane_qh.y;
  return ((ql >> (4 * (k / 2))) & 0x0f0f0f0fu) | (((qh >> (2 * k)) << 4) & 0x30303030u);
}

// a.lo16 * b.byte(2 half) + a.hi16 * b.byte(2 half + 1) + c, signed (dp2a).
__host__ __device__ inline int Dot2(uint32_t a, uint32_t b, int half, int c) {
#if defined(__CUDA_ARCH__)
  return half == 0 ? __dp2a_lo(static_cast<int>(a), static_cast<int>(b), c)
                   : __dp2a_hi(static_cast<int>(a), static_cast<int>(b), c);
#else
  return c + static_cast<int16_t>(a & 0xffffu) * ByteS(b, 2 * half) +
         static_cast<int16_t>(a >> 16) * ByteS(b, 2 * half + 1);
#endif
}

// Q6_K: sum_j sc[j] * bsums[j] of a block (the -32 offset's factor). sc: the 16 int8 scales;
// b0, b1: bsums[0..7], bsums[8..15].
__host__ __device__ inline int Q6_KOffsetSum(const uint4& sc, const uint4& b0, const uint4& b1) {
  int sum = 0;
  for (int w = 0; w < 8; ++w) sum = Dot2(Word(w < 4 ? b0 : b1, w % 4), Word(sc, w / 2), w % 2, sum);
  return sum;
}

// One block of a Q6_K output's chain.
__host__ __device__ inline float Q6_KTileStep(float acc, int isum, int offset_sum, float d, float d_a) {
  return fmaf(d * d_a, static_cast<float>(isum - 32 * offset_sum), acc);
}

// Where a staged 256-block of a K-quant tile (mma_kquant_tiles.cuh: 64 rows x kBN tokens) lies in
// one shared-memory buffer: each row's 128 qs (Q4_K, Q5_K) or ql (Q6_K) bytes in the device layout
// (lane i's 16 bytes at 16i) at a stride of 192, so that the 16-byte loads of a quarter warp's two
// rows fall in different halves of the banks; Q6_K's 64 qh bytes (lane i's 8 at 8i) at a stride of
// 96 (a half warp's 4 rows in 4 quarters of the banks), Q5_K's 32 (lane i's 4 at 4i) at a stride of
// 48 (a warp's 8 rows in 8 eighths); each row's 16 header (Q4_K, Q5_K: d, dmin, the 12 scale bytes)
// or scale (Q6_K) bytes; each token's 256 quants in the Q8_K layout (lane i's 32 bytes
// at 32i) at a stride of 272, its 16 bsums and its f32 d. The offsets the warps read (Qs .. D) and
// the copies that put the bytes there (Chunk) are one description, which kquant_layout_test checks
// against the device layouts.
template <int kType, int kBN>
struct KQuantTileLayout {
  static_assert(kType == kDevQ4_K || kType == kDevQ5_K || kType == kDevQ6_K, "tiled K-quant types");
  static_assert(kBN == 32 || kBN == 64, "tokens per tile");
  static constexpr int kRows = 64;  // kMmaTileRows
  static constexpr bool kQ5 = kType == kDevQ5_K, kQ6 = kType == kDevQ6_K;
  // qh bytes a row and block (lane i's at i * kQhLane); none for Q4_K.
  static constexpr int kQhBytes = kQ6 ? 64 : (kQ5 ? 32 : 0), kQhLane = kQhBytes / 8;
  static constexpr int kRowStride = 192, kQhStride = kQ6 ? 96 : 48, kTokStride = 272;
  static constexpr int kQhOffset = kRows * kRowStride;
  static constexpr int kHeaderOffset = kQhOffset + (kQhBytes > 0 ? kRows * kQhStride : 0);
  static constexpr int kTokOffset = kHeaderOffset + kRows * 16;
  static constexpr int kBsumsOffset = kTokOffset + kBN * kTokStride;
  static constexpr int kDOffset = kBsumsOffset + kBN * 32;
  static constexpr int kBufferBytes = kDOffset + kBN * 4;

  // Row r's 16 qs / ql bytes of lane `lane`, its kQhLane qh bytes (Q5_K, Q6_K), its 16 header /
  // scale bytes.
  __host__ __device__ static constexpr int Qs(int r, int lane) { return r * kRowStride + 16 * lane; }
  __host__ __device__ static constexpr int Qh(int r, int lane) { return kQhOffset + r * kQhStride + kQhLane * lane; }
  __host__ __device__ static constexpr int Header(int r) { return kHeaderOffset + 16 * r; }
  // Token t's 16 quant bytes of lane `lane` (half 0: groups 0..3, 1: groups 4..7), its 32 bsum bytes
  // and its f32 d.
  __host__ __device__ static constexpr int Quants(int t, int lane, int half) {
    return kTokOffset + t * kTokStride + 32 * lane + 16 * half;
  }
  __host__ __device__ static constexpr int Bsums(int t) { return kBsumsOffset + 32 * t; }
  __host__ __device__ static constexpr int D(int t) { return kDOffset + 4 * t; }

  // The 16-byte copies of a block: the rows' qs / ql (8 a row), qh (4 for Q6_K, 2 for Q5_K), header
  // / scales (1);
  // the tokens' quants (16) and bsums (2). Copy `idx` of block i takes 16 bytes at `src` bytes
  // past the start (block 0) of row or token `index`'s `part` into the buffer at `dst`. The tokens'
  // d are 4-byte copies of their own (D).
  enum Part { kRowQs, kRowQh, kRowHeader, kTokQuants, kTokBsums };
  struct Copy {
    Part part;
    int index, dst;
    int64_t src;
  };
  static constexpr int kQhCopiesPerRow = kQhBytes / 16;
  static constexpr int kRowQsCopies = kRows * 8, kRowQhCopies = kRows * kQhCopiesPerRow, kHeaderCopies = kRows;
  static constexpr int kQuantCopies = kBN * 16, kBsumsCopies = kBN * 2;
  static constexpr int kCopies = kRowQsCopies + kRowQhCopies + kHeaderCopies + kQuantCopies + kBsumsCopies;
  __host__ __device__ static Copy CopyOf(int idx, int i) {
    if (idx < kRowQsCopies)
      return {kRowQs, idx / 8, Qs(idx / 8, 0) + (idx % 8) * 16, int64_t(i) * 128 + (idx % 8) * 16};
    idx -= kRowQsCopies;
    if constexpr (kQhCopiesPerRow > 0) {  // Q4_K has no qh
      if (idx < kRowQhCopies) {
        const int r = idx / kQhCopiesPerRow, c = idx % kQhCopiesPerRow;
        return {kRowQh, r, Qh(r, 0) + c * 16, int64_t(i) * kQhBytes + c * 16};
      }
    }
    idx -= kRowQhCopies;
    if (idx < kHeaderCopies) return {kRowHeader, idx, Header(idx), int64_t(i) * 16};
    idx -= kHeaderCopies;
    if (idx < kQuantCopies)
      return {kTokQuants, idx / 16, Quants(idx / 16, 0, 0) + (idx % 16) * 16, int64_t(i) * 256 + (idx % 16) * 16};
    idx -= kQuantCopies;
    return {kTokBsums, idx / 2, Bsums(idx / 2) + (idx % 2) * 16, int64_t(i) * 32 + (idx % 2) * 16};
  }
};

}  // namespace mer::cuda
