// The quantized weight types other than Q8_0 in device memory: those of 256-element blocks (Q2_K to
// Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S) with their Q8_K activations, those of 32 (Q4_0, Q5_0,
// IQ4_NL with Q8_0 activations, Q4_1 and Q5_1 with Q8_1), and the per-lane integer arithmetic of
// their dot products.
// Everything here is __host__ __device__ and free of device intrinsics outside Dot4 / BytePerm /
// Popc (each with its host form), so that a host test (tests/unit/compute/kquant_layout_test.cc)
// can run a lane group's arithmetic on the CPU against the CPU kernels.
//
// The CPU kernels of the 256-element types (common/quant/q*_k_rows.cc, iq*_rows.cc; avx2, and
// avx512 with the same integers) keep 8 int32 lanes per weight row; lane i
// covers bytes 4i..4i+3 of every 32-element run of a 256-block ("group" g = element / 32, 8
// groups). One GPU lane group of 8 lanes computes one row, lane i holding CPU lane i, so each
// lane needs word i of every group; the layouts put those words next to each other
// (LaneInterleave) so a lane reads them with one 16-byte load.
//
// Weights, a matrix of n = rows * cols / 256 blocks, block b = row * (cols / 256) + block in row;
// the same bytes as the file's blocks, regrouped (kquant_repack.cuh converts on upload; IQ4_XS's
// nibbles are regrouped too):
//   Q4_K (144 bytes a block): qs [n][128] at 0, lane i's 16 bytes at 16i = qs[32c + 4i .. +3]
//        for chunks c = 0..3; headers [n][16] at 128n = d, dmin, scales[12] as in the file.
//   Q5_K (176 bytes a block): qs [n][128] at 0 as Q4_K's; qh [n][32] at 128n as in the file (lane
//        i's 4 bytes at 4i are the fifth bits of its elements); headers [n][16] at 160n as Q4_K's.
//   Q6_K (210 bytes a block): ql [n][128] at 0, lane i's 16 bytes = ql[32r + 4i .. +3] for runs
//        r = 0..3; qh [n][64] at 128n, lane i's 8 bytes = qh[4i .. +3], qh[32 + 4i .. +3];
//        scales [n][16] at 192n; d f16 [n] at 208n.
//   Q3_K (110 bytes a block): qs [n][64] at 0, lane i's 8 bytes = qs[4i .. +3], qs[32 + 4i .. +3]
//        (as Q6_K's qh); hmask [n][32] at 64n as in the file (lane i's 4 bytes at 4i); scales
//        [n][12] at 96n as in the file; d f16 [n] at 108n.
//   Q2_K (84 bytes a block): qs [n][64] at 0 as Q3_K's; scales [n][16] at 64n as in the file;
//        d, dmin f16 [n][2] at 80n.
//   IQ4_XS (136 bytes a block): codes [n][128] at 0, lane i's 16 bytes at 16i, byte k of its word
//        c holding the codes of elements 4i + k of sub-blocks 2c (low nibble) and 2c + 1 (high
//        nibble); headers [n][8] at 128n = d, scales_h, scales_l[4] as in the file.
//   IQ2_XXS (66 bytes a block): grid indices [n][32] at 0, lanes 2p and 2p + 1 (group p of 8
//        elements of every sub-block) reading the 8 bytes at 8p, byte j = sub-block j's index of
//        group p; sign and scale words [n][32] at 32n (sub-block j's second u32 at 4j); d f16 [n]
//        at 64n.
//
// Q4_0 and IQ4_NL (18-byte blocks of 32, Q8_0 activations in device_layout.cuh's layout): the CPU
// kernel (common/quant/table4_rows.h, ggml's 8-row gemv order) adds one exact int32 sum per block to
// one f32 per row. A lane group of 8 lanes computes one row, lane i the 4 products of elements
// 4i..4i+3 of each block, then the group's integer sum (shuffles; exact in any order) and the
// row's fma chain. Layout: codes [n][16] at 0, lane i's 2 bytes at 16b + 2i holding the codes of
// elements 4i..4i+3 in their nibbles (low first); d f16 [n] at 16n.
// Q5_0 (22-byte blocks of 32, Q8_0 activations): the CPU kernel (legacy_rows.cc) keeps 8 int32 lanes
// per row as Q8_0's, lane i the 4 products of elements 4i..4i+3 of a block, acc_i = fma(d_w * d_a,
// (float)isum_i, acc_i), then HorizontalSum; a lane group's lane i is CPU lane i. Layout: codes
// [n][16] at 0 as Q4_0's (the low 4 bits), qh u32 [n] at 16n as in the file (bit e = element e's
// fifth bit), d f16 [n] at 20n.
// Q4_1 and Q5_1 (20- and 24-byte blocks of 32, Q8_1 activations: Q8_0's layout, DevAct::scales[b]
// holding the block's f16 d in its low and f16 s = d * sum(q) in its high 16 bits): the CPU kernel
// (legacy_rows.cc) keeps Q5_0's 8 lanes of unsigned codes times d_w * d_a, and per block
// acc_m = fma(m_w, s_a, acc_m) in one f32; the result is HorizontalSum + acc_m. Layout: codes
// [n][16] at 0 as Q4_0's; Q5_1 qh u32 [n] at 16n; then d, m f16 [n][2] (at 16n, Q5_1 at 20n).
//   IQ2_XS (74 bytes a block): grid words [n][64] at 0, lanes 2p and 2p + 1 reading the 16 bytes
//        at 16p, u16 j = sub-block j's word of group p (9-bit grid index, 7 sign bits); scales
//        [n][8] at 64n as in the file; d f16 [n] at 72n.
//   IQ3_XXS (98 bytes a block): grid indices [n][64] at 0, lane i's 8 bytes at 8i, byte j =
//        sub-block j's index of elements 4i..4i+3 (qs[8j + i]); sign and scale words [n][32] at 64n
//        as in the file; d f16 [n] at 96n.
//   IQ3_S (110 bytes a block): grid indices [n][64] at 0 as IQ3_XXS's (the low 8 bits of each);
//        signs [n][32] at 64n, lanes 2p and 2p + 1 reading the 8 bytes at 8p, byte j = sub-block j's
//        signs of group p (signs[4j + p]); qh [n][8] at 96n, scales [n][4] at 104n as in the file;
//        d f16 [n] at 108n.
//   IQ2_S (82 bytes a block): grid and sign bytes [n][64] at 0, lanes 2p and 2p + 1 reading the 16
//        bytes at 16p, byte j = sub-block j's index (low 8 bits) of group p (qs[4j + p]), byte 8 + j
//        its signs (qs[32 + 4j + p]); headers [n][16] at 64n = qh[8], scales[8] as in the file; d
//        f16 [n] at 80n.
//   IQ1_S (50 bytes a block): grid indices [n][32] at 0 as IQ2_XXS's (the low 8 bits of each); qh
//        u16 [n][8] at 32n as in the file; d f16 [n] at 48n.
// Activations, Q8_K rows of `stride` elements (a multiple of 256), row t at t * Q8_KRowBytes:
//   quants [stride] (block b at 256b, element e of it at LaneInterleave(e, 8): lane i's 32 bytes
//   at 32i are its words of groups 0..7), then bsums int16 [stride / 16] (16 per block, as
//   BlockQ8_K); d f32 per block in DevAct::scales (row t at scales + t * stride / 256).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

inline constexpr int kKBlock = 256;  // elements per K-quant / Q8_K block
inline constexpr int kQ4_KBlockBytes = 144;
inline constexpr int kQ2_KBlockBytes = 84;
inline constexpr int kQ3_KBlockBytes = 110;
inline constexpr int kQ5_KBlockBytes = 176;
inline constexpr int kQ6_KBlockBytes = 210;
inline constexpr int kIQ4_XSBlockBytes = 136;
inline constexpr int kIQ2_XXSBlockBytes = 66;
inline constexpr int kIQ2_XSBlockBytes = 74;
inline constexpr int kIQ3_XXSBlockBytes = 98;
inline constexpr int kIQ3_SBlockBytes = 110;
inline constexpr int kIQ2_SBlockBytes = 82;
inline constexpr int kIQ1_SBlockBytes = 50;
// IQ1_S's offset: blocks.h's kIQ1_SDelta, repeated so device code needs no host header.
inline constexpr float kIQ1_SDelta = 0.125f;
inline constexpr int kTable4Block = 32;  // elements per Q4_0 / IQ4_NL block
inline constexpr int kTable4BlockBytes = 18;
inline constexpr int kQ5_0BlockBytes = 22;
inline constexpr int kQ4_1BlockBytes = 20;
inline constexpr int kQ5_1BlockBytes = 24;

// Where byte j of a region of 32 * words bytes goes when each of the 8 lanes owns bytes
// 4i..4i+3 of every 32-byte run: run j / 32 becomes word j / 32 of lane (j % 32) / 4's
// 4 * words contiguous bytes.
__host__ __device__ constexpr int LaneInterleave(int j, int words) {
  return (j % 32) / 4 * (4 * words) + (j / 32) * 4 + j % 4;
}

// Byte offsets in a Q4_K matrix of n blocks.
__host__ __device__ constexpr int64_t Q4_KQsOffset(int64_t b, int lane) { return b * 128 + 16 * lane; }
__host__ __device__ constexpr int64_t Q4_KHeaderOffset(int64_t n, int64_t b) { return 128 * n + 16 * b; }
// Byte offsets in a Q5_K matrix of n blocks.
__host__ __device__ constexpr int64_t Q5_KQsOffset(int64_t b, int lane) { return b * 128 + 16 * lane; }
__host__ __device__ constexpr int64_t Q5_KQhOffset(int64_t n, int64_t b, int lane) {
  return 128 * n + 32 * b + 4 * lane;
}
__host__ __device__ constexpr int64_t Q5_KHeaderOffset(int64_t n, int64_t b) { return 160 * n + 16 * b; }
// Byte offsets in a Q3_K matrix of n blocks.
__host__ __device__ constexpr int64_t Q3_KQsOffset(int64_t b, int lane) { return b * 64 + 8 * lane; }
__host__ __device__ constexpr int64_t Q3_KHmaskOffset(int64_t n, int64_t b, int lane) {
  return 64 * n + 32 * b + 4 * lane;
}
__host__ __device__ constexpr int64_t Q3_KScalesOffset(int64_t n, int64_t b) { return 96 * n + 12 * b; }
__host__ __device__ constexpr int64_t Q3_KDOffset(int64_t n, int64_t b) { return 108 * n + 2 * b; }
// Byte offsets in a Q2_K matrix of n blocks.
__host__ __device__ constexpr int64_t Q2_KQsOffset(int64_t b, int lane) { return b * 64 + 8 * lane; }
__host__ __device__ constexpr int64_t Q2_KScalesOffset(int64_t n, int64_t b) { return 64 * n + 16 * b; }
__host__ __device__ constexpr int64_t Q2_KDOffset(int64_t n, int64_t b) { return 80 * n + 4 * b; }
// Byte offsets in an IQ4_XS matrix of n blocks.
__host__ __device__ constexpr int64_t IQ4_XSQsOffset(int64_t b, int lane) { return b * 128 + 16 * lane; }
__host__ __device__ constexpr int64_t IQ4_XSHeaderOffset(int64_t n, int64_t b) { return 128 * n + 8 * b; }
// Byte offsets in an IQ2_XXS matrix of n blocks.
__host__ __device__ constexpr int64_t IQ2_XXSIndexOffset(int64_t b, int lane) { return b * 32 + 8 * (lane / 2); }
__host__ __device__ constexpr int64_t IQ2_XXSWordsOffset(int64_t n, int64_t b) { return 32 * n + 32 * b; }
__host__ __device__ constexpr int64_t IQ2_XXSDOffset(int64_t n, int64_t b) { return 64 * n + 2 * b; }
// Byte offsets in an IQ2_XS matrix of n blocks.
__host__ __device__ constexpr int64_t IQ2_XSWordsOffset(int64_t b, int lane) { return b * 64 + 16 * (lane / 2); }
__host__ __device__ constexpr int64_t IQ2_XSScalesOffset(int64_t n, int64_t b) { return 64 * n + 8 * b; }
__host__ __device__ constexpr int64_t IQ2_XSDOffset(int64_t n, int64_t b) { return 72 * n + 2 * b; }
// Byte offsets in an IQ3_XXS matrix of n blocks.
__host__ __device__ constexpr int64_t IQ3_XXSIndexOffset(int64_t b, int lane) { return b * 64 + 8 * lane; }
__host__ __device__ constexpr int64_t IQ3_XXSWordsOffset(int64_t n, int64_t b) { return 64 * n + 32 * b; }
__host__ __device__ constexpr int64_t IQ3_XXSDOffset(int64_t n, int64_t b) { return 96 * n + 2 * b; }
// Byte offsets in an IQ3_S matrix of n blocks.
__host__ __device__ constexpr int64_t IQ3_SIndexOffset(int64_t b, int lane) { return b * 64 + 8 * lane; }
__host__ __device__ constexpr int64_t IQ3_SSignsOffset(int64_t n, int64_t b, int lane) {
  return 64 * n + 32 * b + 8 * (lane / 2);
}
__host__ __device__ constexpr int64_t IQ3_SQhOffset(int64_t n, int64_t b) { return 96 * n + 8 * b; }
__host__ __device__ constexpr int64_t IQ3_SScalesOffset(int64_t n, int64_t b) { return 104 * n + 4 * b; }
__host__ __device__ constexpr int64_t IQ3_SDOffset(int64_t n, int64_t b) { return 108 * n + 2 * b; }
// Byte offsets in an IQ2_S matrix of n blocks.
__host__ __device__ constexpr int64_t IQ2_SWordsOffset(int64_t b, int lane) { return b * 64 + 16 * (lane / 2); }
__host__ __device__ constexpr int64_t IQ2_SHeaderOffset(int64_t n, int64_t b) { return 64 * n + 16 * b; }
__host__ __device__ constexpr int64_t IQ2_SDOffset(int64_t n, int64_t b) { return 80 * n + 2 * b; }
// Byte offsets in an IQ1_S matrix of n blocks.
__host__ __device__ constexpr int64_t IQ1_SIndexOffset(int64_t b, int lane) { return b * 32 + 8 * (lane / 2); }
__host__ __device__ constexpr int64_t IQ1_SQhOffset(int64_t n, int64_t b) { return 32 * n + 16 * b; }
__host__ __device__ constexpr int64_t IQ1_SDOffset(int64_t n, int64_t b) { return 48 * n + 2 * b; }
// Byte offsets in a Q4_0 / IQ4_NL matrix of n blocks.
__host__ __device__ constexpr int64_t Table4CodesOffset(int64_t b, int lane) { return b * 16 + 2 * lane; }
__host__ __device__ constexpr int64_t Table4DOffset(int64_t n, int64_t b) { return 16 * n + 2 * b; }
// Byte offsets in a Q5_0 matrix of n blocks (codes as Table4CodesOffset).
__host__ __device__ constexpr int64_t Q5_0QhOffset(int64_t n, int64_t b) { return 16 * n + 4 * b; }
__host__ __device__ constexpr int64_t Q5_0DOffset(int64_t n, int64_t b) { return 20 * n + 2 * b; }
// Byte offsets in a Q4_1 / Q5_1 matrix of n blocks (codes as Table4CodesOffset).
__host__ __device__ constexpr int64_t Q5_1QhOffset(int64_t n, int64_t b) { return 16 * n + 4 * b; }
__host__ __device__ constexpr int64_t Q4_1DmOffset(int64_t n, int64_t b) { return 16 * n + 4 * b; }
__host__ __device__ constexpr int64_t Q5_1DmOffset(int64_t n, int64_t b) { return 20 * n + 4 * b; }
// Byte offsets in a Q6_K matrix of n blocks.
__host__ __device__ constexpr int64_t Q6_KQlOffset(int64_t b, int lane) { return b * 128 + 16 * lane; }
__host__ __device__ constexpr int64_t Q6_KQhOffset(int64_t n, int64_t b, int lane) {
  return 128 * n + 64 * b + 8 * lane;
}
__host__ __device__ constexpr int64_t Q6_KScalesOffset(int64_t n, int64_t b) { return 192 * n + 16 * b; }
__host__ __device__ constexpr int64_t Q6_KDOffset(int64_t n, int64_t b) { return 208 * n + 2 * b; }

// Q8_K activation rows: bytes per row, and offsets from the row start.
__host__ __device__ constexpr int64_t Q8_KRowBytes(int64_t stride) { return stride + stride / 8; }
__host__ __device__ constexpr int64_t Q8_KQuantOffset(int64_t e) {
  return e / kKBlock * kKBlock + LaneInterleave(int(e % kKBlock), 8);
}
__host__ __device__ constexpr int64_t Q8_KLaneOffset(int64_t b, int lane) { return b * kKBlock + 32 * lane; }
__host__ __device__ constexpr int64_t Q8_KBsumsOffset(int64_t stride, int64_t b) { return stride + 32 * b; }

// GGUF block b -> device layout (the byte moves described above), for the repack kernel and
// host tests. src: the block's bytes; dst: the matrix of n blocks.
__host__ __device__ inline void RepackQ4_KBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* qs = dst + Q4_KQsOffset(b, 0);
  for (int j = 0; j < 128; ++j) qs[LaneInterleave(j, 4)] = src[16 + j];
  uint8_t* header = dst + Q4_KHeaderOffset(n, b);
  for (int j = 0; j < 16; ++j) header[j] = src[j];
}
__host__ __device__ inline void RepackQ6_KBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* ql = dst + Q6_KQlOffset(b, 0);
  for (int j = 0; j < 128; ++j) ql[LaneInterleave(j, 4)] = src[j];
  uint8_t* qh = dst + Q6_KQhOffset(n, b, 0);
  for (int j = 0; j < 64; ++j) qh[LaneInterleave(j, 2)] = src[128 + j];
  uint8_t* scales = dst + Q6_KScalesOffset(n, b);
  for (int j = 0; j < 16; ++j) scales[j] = src[192 + j];
  dst[Q6_KDOffset(n, b)] = src[208];
  dst[Q6_KDOffset(n, b) + 1] = src[209];
}

__host__ __device__ inline void RepackQ5_KBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* qs = dst + Q5_KQsOffset(b, 0);
  for (int j = 0; j < 128; ++j) qs[LaneInterleave(j, 4)] = src[48 + j];
  uint8_t* qh = dst + Q5_KQhOffset(n, b, 0);
  for (int j = 0; j < 32; ++j) qh[j] = src[16 + j];
  uint8_t* header = dst + Q5_KHeaderOffset(n, b);
  for (int j = 0; j < 16; ++j) header[j] = src[j];
}
__host__ __device__ inline void RepackQ3_KBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* qs = dst + Q3_KQsOffset(b, 0);
  for (int j = 0; j < 64; ++j) qs[LaneInterleave(j, 2)] = src[32 + j];
  uint8_t* hmask = dst + Q3_KHmaskOffset(n, b, 0);
  for (int j = 0; j < 32; ++j) hmask[j] = src[j];
  uint8_t* scales = dst + Q3_KScalesOffset(n, b);
  for (int j = 0; j < 12; ++j) scales[j] = src[96 + j];
  dst[Q3_KDOffset(n, b)] = src[108];
  dst[Q3_KDOffset(n, b) + 1] = src[109];
}
__host__ __device__ inline void RepackQ2_KBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* qs = dst + Q2_KQsOffset(b, 0);
  for (int j = 0; j < 64; ++j) qs[LaneInterleave(j, 2)] = src[16 + j];
  uint8_t* scales = dst + Q2_KScalesOffset(n, b);
  for (int j = 0; j < 16; ++j) scales[j] = src[j];
  for (int j = 0; j < 4; ++j) dst[Q2_KDOffset(n, b) + j] = src[80 + j];
}
// IQ4_XS: sub-block j's element e (< 16: low nibble of qs[16j + e], else the high nibble of
// qs[16j + e - 16]) goes to lane e / 4's word j / 2, byte e % 4, nibble j % 2.
__host__ __device__ inline void RepackIQ4_XSBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  const uint8_t* qs = src + 8;
  uint8_t* codes = dst + IQ4_XSQsOffset(b, 0);
  for (int lane = 0; lane < 8; ++lane)
    for (int c = 0; c < 4; ++c)
      for (int k = 0; k < 4; ++k) {
        const int e = 4 * lane + k, shift = e < 16 ? 0 : 4, byte = e % 16;
        const int lo = (qs[16 * (2 * c) + byte] >> shift) & 0xF, hi = (qs[16 * (2 * c + 1) + byte] >> shift) & 0xF;
        codes[16 * lane + 4 * c + k] = static_cast<uint8_t>(lo | (hi << 4));
      }
  uint8_t* header = dst + IQ4_XSHeaderOffset(n, b);
  for (int j = 0; j < 8; ++j) header[j] = src[j];
}
// IQ2_XXS: sub-block j's 8 bytes at 2 + 8j are its grid indices (one per group) and its sign and
// scale word.
__host__ __device__ inline void RepackIQ2_XXSBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* index = dst + IQ2_XXSIndexOffset(b, 0);
  uint8_t* words = dst + IQ2_XXSWordsOffset(n, b);
  for (int j = 0; j < 8; ++j) {
    for (int p = 0; p < 4; ++p) index[8 * p + j] = src[2 + 8 * j + p];
    for (int k = 0; k < 4; ++k) words[4 * j + k] = src[2 + 8 * j + 4 + k];
  }
  dst[IQ2_XXSDOffset(n, b)] = src[0];
  dst[IQ2_XXSDOffset(n, b) + 1] = src[1];
}

// IQ2_XS: sub-block j's group p word (qs[4j + p], at byte 2 + 8j + 2p) to lane pair p's u16 j.
__host__ __device__ inline void RepackIQ2_XSBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* words = dst + IQ2_XSWordsOffset(b, 0);
  for (int j = 0; j < 8; ++j)
    for (int p = 0; p < 4; ++p) {
      words[16 * p + 2 * j] = src[2 + 8 * j + 2 * p];
      words[16 * p + 2 * j + 1] = src[2 + 8 * j + 2 * p + 1];
    }
  for (int j = 0; j < 8; ++j) dst[IQ2_XSScalesOffset(n, b) + j] = src[66 + j];
  dst[IQ2_XSDOffset(n, b)] = src[0];
  dst[IQ2_XSDOffset(n, b) + 1] = src[1];
}
// IQ3_XXS: qs[8j + i] (at byte 2 + 8j + i) to lane i's byte j; the words as they are.
__host__ __device__ inline void RepackIQ3_XXSBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* index = dst + IQ3_XXSIndexOffset(b, 0);
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 8; ++i) index[8 * i + j] = src[2 + 8 * j + i];
  for (int j = 0; j < 32; ++j) dst[IQ3_XXSWordsOffset(n, b) + j] = src[66 + j];
  dst[IQ3_XXSDOffset(n, b)] = src[0];
  dst[IQ3_XXSDOffset(n, b) + 1] = src[1];
}
// IQ3_S (d at 0, qs at 2, qh at 66, signs at 74, scales at 106): qs[8j + i] to lane i's byte j as
// IQ3_XXS's; signs[4j + p] to lane pair p's byte j; qh, scales and d as they are.
__host__ __device__ inline void RepackIQ3_SBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* index = dst + IQ3_SIndexOffset(b, 0);
  uint8_t* signs = dst + IQ3_SSignsOffset(n, b, 0);
  for (int j = 0; j < 8; ++j) {
    for (int i = 0; i < 8; ++i) index[8 * i + j] = src[2 + 8 * j + i];
    for (int p = 0; p < 4; ++p) signs[8 * p + j] = src[74 + 4 * j + p];
  }
  for (int j = 0; j < 8; ++j) dst[IQ3_SQhOffset(n, b) + j] = src[66 + j];
  for (int j = 0; j < 4; ++j) dst[IQ3_SScalesOffset(n, b) + j] = src[106 + j];
  dst[IQ3_SDOffset(n, b)] = src[0];
  dst[IQ3_SDOffset(n, b) + 1] = src[1];
}
// IQ2_S (d at 0, grid indices at 2, signs at 34, qh at 66, scales at 74): sub-block j's group p
// index byte (qs[4j + p]) and sign byte (qs[32 + 4j + p]) to lane pair p's bytes j and 8 + j; qh,
// scales and d as they are.
__host__ __device__ inline void RepackIQ2_SBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* words = dst + IQ2_SWordsOffset(b, 0);
  for (int j = 0; j < 8; ++j)
    for (int p = 0; p < 4; ++p) {
      words[16 * p + j] = src[2 + 4 * j + p];
      words[16 * p + 8 + j] = src[34 + 4 * j + p];
    }
  for (int j = 0; j < 16; ++j) dst[IQ2_SHeaderOffset(n, b) + j] = src[66 + j];
  dst[IQ2_SDOffset(n, b)] = src[0];
  dst[IQ2_SDOffset(n, b) + 1] = src[1];
}
// IQ1_S (d at 0, grid indices at 2, qh at 34): sub-block j's group p index byte (qs[4j + p]) to lane
// pair p's byte j; qh and d as they are.
__host__ __device__ inline void RepackIQ1_SBlock(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  uint8_t* index = dst + IQ1_SIndexOffset(b, 0);
  for (int j = 0; j < 8; ++j)
    for (int p = 0; p < 4; ++p) index[8 * p + j] = src[2 + 4 * j + p];
  for (int j = 0; j < 16; ++j) dst[IQ1_SQhOffset(n, b) + j] = src[34 + j];
  dst[IQ1_SDOffset(n, b)] = src[0];
  dst[IQ1_SDOffset(n, b) + 1] = src[1];
}
// Q4_0 / IQ4_NL: element e (< 16: low nibble of qs[e], else the high nibble of qs[e - 16]) goes
// to lane e / 4's 2 bytes, nibble e % 4.
__host__ __device__ inline void RegroupNibbles32(const uint8_t* qs, uint8_t* codes) {
  for (int j = 0; j < 16; ++j) {
    const int e0 = 2 * j, e1 = 2 * j + 1;
    const int c0 = (qs[e0 % 16] >> (e0 < 16 ? 0 : 4)) & 0xF, c1 = (qs[e1 % 16] >> (e1 < 16 ? 0 : 4)) & 0xF;
    codes[j] = static_cast<uint8_t>(c0 | (c1 << 4));
  }
}
__host__ __device__ inline void RepackTable4Block(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  RegroupNibbles32(src + 2, dst + Table4CodesOffset(b, 0));
  dst[Table4DOffset(n, b)] = src[0];
  dst[Table4DOffset(n, b) + 1] = src[1];
}
// Q4_1 / Q5_1: the codes' low 4 bits as Q4_0's; qh, d and m moved.
__host__ __device__ inline void RepackQ4_1Block(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  RegroupNibbles32(src + 4, dst + Table4CodesOffset(b, 0));
  for (int j = 0; j < 4; ++j) dst[Q4_1DmOffset(n, b) + j] = src[j];
}
__host__ __device__ inline void RepackQ5_1Block(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  RegroupNibbles32(src + 8, dst + Table4CodesOffset(b, 0));
  for (int j = 0; j < 4; ++j) dst[Q5_1QhOffset(n, b) + j] = src[4 + j];
  for (int j = 0; j < 4; ++j) dst[Q5_1DmOffset(n, b) + j] = src[j];
}
// Q5_0: the codes' low 4 bits as Q4_0's; qh and d moved.
__host__ __device__ inline void RepackQ5_0Block(const uint8_t* src, uint8_t* dst, int64_t n, int64_t b) {
  RegroupNibbles32(src + 6, dst + Table4CodesOffset(b, 0));
  for (int j = 0; j < 4; ++j) dst[Q5_0QhOffset(n, b) + j] = src[2 + j];
  dst[Q5_0DOffset(n, b)] = src[0];
  dst[Q5_0DOffset(n, b) + 1] = src[1];
}

// Byte k of w, unsigned and sign-extended.
__host__ __device__ inline int ByteU(uint32_t w, int k) { return static_cast<int>((w >> (8 * k)) & 0xffu); }
__host__ __device__ inline int ByteS(uint32_t w, int k) { return static_cast<int>(static_cast<int8_t>(w >> (8 * k))); }

// Sum of the 4 products of the signed bytes of a and b (dp4a).
__host__ __device__ inline int Dot4(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), 0);
#else
  int s = 0;
  for (int k = 0; k < 4; ++k) s += ByteS(a, k) * ByteS(b, k);
  return s;
#endif
}

// Bytes of the 8 bytes y:x picked by the 4 selector nibbles of s (each < 8): prmt.
__host__ __device__ inline uint32_t BytePerm(uint32_t x, uint32_t y, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, s);
#else
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * k)) & 7))) & 0xffu) << (8 * k);
  return r;
#endif
}

// Number of set bits.
__host__ __device__ inline int Popc(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

// The 6-bit scales sc[0..7] and mins m[0..7] of a Q4_K header (words: d | dmin << 16, then the
// 12 scale bytes), four bytes a word: the CPU kernel's DecodeScalesMins (q4_k_rows.cc), which is
// the packing of blocks.h undone.
struct Q4_KScales {
  uint32_t sc_lo, sc_hi, m_lo, m_hi;  // sc[0..3], sc[4..7], m[0..3], m[4..7]
};
__host__ __device__ inline Q4_KScales DecodeQ4_KScales(uint4 header) {
  const uint32_t u0 = header.y, u1 = header.z, u2 = header.w;
  return {u0 & 0x3f3f3f3fu, (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u), u1 & 0x3f3f3f3fu,
          ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u)};
}

// Q4_K, lane i's int32 of one block (the CPU's sumi lane i): sum over chunks c of
// sc[2c] * (low nibbles . group 2c) + sc[2c + 1] * (high nibbles . group 2c + 1), 4 elements each.
// w: the lane's qs words (chunks 0..3); a0, a1: its activation words of groups 0..3 and 4..7.
// |result| < 2^22, so its f32 conversion is exact.
__host__ __device__ inline int Q4_KLaneSum(uint4 w, const Q4_KScales& s, uint4 a0, uint4 a1) {
  constexpr uint32_t kLow = 0x0f0f0f0fu;
  return ByteU(s.sc_lo, 0) * Dot4(w.x & kLow, a0.x) + ByteU(s.sc_lo, 1) * Dot4((w.x >> 4) & kLow, a0.y) +
         ByteU(s.sc_lo, 2) * Dot4(w.y & kLow, a0.z) + ByteU(s.sc_lo, 3) * Dot4((w.y >> 4) & kLow, a0.w) +
         ByteU(s.sc_hi, 0) * Dot4(w.z & kLow, a1.x) + ByteU(s.sc_hi, 1) * Dot4((w.z >> 4) & kLow, a1.y) +
         ByteU(s.sc_hi, 2) * Dot4(w.w & kLow, a1.z) + ByteU(s.sc_hi, 3) * Dot4((w.w >> 4) & kLow, a1.w);
}

// Q4_K, the dmin term's int32 lane i (i in 0..3; the CPU's prod_m, 4 lanes):
// m[2i] * (bsums[4i] + bsums[4i + 1]) + m[2i + 1] * (bsums[4i + 2] + bsums[4i + 3]).
// bs: bsums[4i .. 4i + 3] of the block (int16 pairs).
__host__ __device__ inline int Q4_KMinLaneSum(const Q4_KScales& s, int lane, uint2 bs) {
  const uint32_t m = lane < 2 ? s.m_lo : s.m_hi;
  const int k = 2 * (lane & 1);
  const int pair0 = static_cast<int16_t>(bs.x & 0xffffu) + static_cast<int16_t>(bs.x >> 16);
  const int pair1 = static_cast<int16_t>(bs.y & 0xffffu) + static_cast<int16_t>(bs.y >> 16);
  return ByteU(m, k) * pair0 + ByteU(m, k + 1) * pair1;
}

// Q5_K, lane i's int32 of one block (the CPU's lane i of ScaledSums, q5_k_rows.cc): Q4_KLaneSum's
// with the fifth bit of each code from qh: bit 2c (low nibbles) or 2c + 1 (high nibbles) of the
// lane's qh bytes. |result| < 2^23, so its f32 conversion is exact.
__host__ __device__ inline int Q5_KLaneSum(uint4 w, uint32_t qh, const Q4_KScales& s, uint4 a0, uint4 a1) {
  constexpr uint32_t kLow = 0x0f0f0f0fu, kBit = 0x01010101u;
  const auto code = [&](uint32_t word, int c, int high) {
    return ((word >> (4 * high)) & kLow) | (((qh >> (2 * c + high)) & kBit) << 4);
  };
  return ByteU(s.sc_lo, 0) * Dot4(code(w.x, 0, 0), a0.x) + ByteU(s.sc_lo, 1) * Dot4(code(w.x, 0, 1), a0.y) +
         ByteU(s.sc_lo, 2) * Dot4(code(w.y, 1, 0), a0.z) + ByteU(s.sc_lo, 3) * Dot4(code(w.y, 1, 1), a0.w) +
         ByteU(s.sc_hi, 0) * Dot4(code(w.z, 2, 0), a1.x) + ByteU(s.sc_hi, 1) * Dot4(code(w.z, 2, 1), a1.y) +
         ByteU(s.sc_hi, 2) * Dot4(code(w.w, 3, 0), a1.z) + ByteU(s.sc_hi, 3) * Dot4(code(w.w, 3, 1), a1.w);
}

// Q5_K, the dmin term's one int32 of a block (the CPU's prod_m): sum over sub-blocks j of
// m[j] * (bsums[2j] + bsums[2j + 1]). b0, b1: the block's bsums[0..7], bsums[8..15].
__host__ __device__ inline int Q5_KMinSum(const Q4_KScales& s, uint4 b0, uint4 b1) {
  const uint32_t pairs[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const int pair = static_cast<int16_t>(pairs[j] & 0xffffu) + static_cast<int16_t>(pairs[j] >> 16);
    sum += ByteU(j < 4 ? s.m_lo : s.m_hi, j % 4) * pair;
  }
  return sum;
}

// Q3_K, lane i's int32 of one block (the CPU's lane i, q3_k_rows.cc): over halves h and runs
// s = 0..3 of 32 elements, (sc[j] - 32) * (codes . group 4h + s), 4 elements each, j = 8h + 2s +
// (i >= 4) (Q3_KScale), a code being bits 2s, 2s + 1 of the lane's qs byte of half h, less 4
// where bit 4h + s of its hmask byte is clear. qs: the lane's qs words (halves 0, 1); hm: its
// hmask word; sc: the 12 scale bytes. |result| < 2^20.
__host__ __device__ inline int Q3_KLaneSum(uint2 qs, uint32_t hm, uint3 sc, int lane, uint4 a0, uint4 a1) {
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const uint32_t scale_words[3] = {sc.x, sc.y, sc.z};
  const int hi = lane >= 4 ? 1 : 0;
  int sum = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t bits = h == 0 ? qs.x : qs.y;
    for (int s = 0; s < 4; ++s) {
      const uint32_t low = (bits >> (2 * s)) & 0x03030303u;
      const uint32_t cleared = ((hm >> (4 * h + s)) & 0x01010101u) ^ 0x01010101u;
      const uint32_t codes = low | (cleared * 0xFCu);  // low - 4 as an int8 where the bit is clear
      const int j = 8 * h + 2 * s + hi;
      const int low4 = j < 8 ? ByteU(scale_words[j / 4], j % 4) & 0xF : ByteU(scale_words[(j - 8) / 4], j % 4) >> 4;
      const int high2 = (ByteU(scale_words[2], j % 4) >> (2 * (j / 4))) & 3;
      sum += ((low4 | (high2 << 4)) - 32) * Dot4(codes, act[4 * h + s]);
    }
  }
  return sum;
}

// Q2_K, lane i's int32 of one block's scaled sums (the CPU's second set of lanes, q2_k_rows.cc):
// over halves h and runs s, (scales[j] & 15) * (codes . group 4h + s), j = 8h + 2s + (i >= 4), a
// code being bits 2s, 2s + 1 of the lane's qs byte of half h. |result| < 2^18.
__host__ __device__ inline int Q2_KLaneSum(uint2 qs, uint4 sc, int lane, uint4 a0, uint4 a1) {
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const uint32_t scale_words[4] = {sc.x, sc.y, sc.z, sc.w};
  const int hi = lane >= 4 ? 1 : 0;
  int sum = 0;
  for (int h = 0; h < 2; ++h) {
    const uint32_t bits = h == 0 ? qs.x : qs.y;
    for (int s = 0; s < 4; ++s) {
      const int j = 8 * h + 2 * s + hi;
      sum += (ByteU(scale_words[j / 4], j % 4) & 0xF) * Dot4((bits >> (2 * s)) & 0x03030303u, act[4 * h + s]);
    }
  }
  return sum;
}

// Q2_K, the mins term's int32 lane i (the CPU's first set of lanes): m[2i] * bsums[2i] +
// m[2i + 1] * bsums[2i + 1], m[j] = scales[j] >> 4. bs: bsums[2i], bsums[2i + 1] (int16 pair).
__host__ __device__ inline int Q2_KMinLaneSum(uint4 sc, int lane, uint32_t bs) {
  const uint32_t scale_words[4] = {sc.x, sc.y, sc.z, sc.w};
  const uint32_t w = scale_words[lane / 2];
  const int k = 2 * (lane & 1);
  return (ByteU(w, k) >> 4) * static_cast<int16_t>(bs & 0xffffu) +
         (ByteU(w, k + 1) >> 4) * static_cast<int16_t>(bs >> 16);
}

// The IQ4 codebook (blocks.h kIQ4Values) as 4 words of 4 int8, for BytePerm; Q4_0's values q - 8
// the same way.
// (Functions, not arrays: device code may not read a host constexpr array.)
__host__ __device__ constexpr uint32_t IQ4Word(int k) {
  return k == 0 ? 0xBFAD9881u : k == 1 ? 0xF6EADDCFu : k == 2 ? 0x26190D01u : 0x71594535u;
}
__host__ __device__ constexpr uint32_t Q4_0Word(int k) {
  return k == 0 ? 0xFBFAF9F8u : k == 1 ? 0xFFFEFDFCu : k == 2 ? 0x03020100u : 0x07060504u;
}

// Entries of the 16-byte table w0..w3 for the 4 codes (each < 16) in the bytes of codes.
__host__ __device__ inline uint32_t Lookup4(uint32_t codes, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const uint32_t t = codes | (codes >> 4);
  const uint32_t sel = (t & 0xffu) | ((t >> 8) & 0xff00u);  // nibble k = code k
  const uint32_t lo = BytePerm(w0, w1, sel & 0x7777u);
  const uint32_t hi = BytePerm(w2, w3, sel & 0x7777u);
  return BytePerm(lo, hi, 0x3210u | ((sel & 0x8888u) >> 1));  // codes >= 8 from hi
}

// The codebook values of the 4 codes (each < 16) in the bytes of codes.
__host__ __device__ inline uint32_t IQ4Lookup4(uint32_t codes) {
  return Lookup4(codes, IQ4Word(0), IQ4Word(1), IQ4Word(2), IQ4Word(3));
}

// The 4 codes in the 2 bytes of `codes` (kquant_layout's Table4 regrouping) as the bytes of a word.
__host__ __device__ inline uint32_t SpreadNibbles(uint32_t codes) {
  return (codes & 0xFu) | ((codes & 0xF0u) << 4) | ((codes & 0xF00u) << 8) | ((codes & 0xF000u) << 12);
}

// Q5_0, lane i's int32 of one block (the CPU's lane i): (code - 16) . the 4 activations, a code
// the lane's nibble with bit 4i + k of qh as its fifth bit. |result| <= 4 * 16 * 127.
__host__ __device__ inline int Q5_0LaneSum(uint32_t codes, uint32_t qh, int lane, uint32_t act) {
  const uint32_t bits = (qh >> (4 * lane)) & 0xFu;
  const uint32_t fifth = (bits * 0x00204081u) & 0x01010101u;  // bit k -> byte k
  // q - 16 as an int8: the low 4 bits where the fifth bit is set, else those bits | 0xf0.
  const uint32_t values = SpreadNibbles(codes) | ((fifth ^ 0x01010101u) * 0xF0u);
  return Dot4(values, act);
}

// Q4_1 / Q5_1, lane i's int32 of one block (the CPU's lane i): unsigned codes . the 4
// activations, Q5_1's codes with bit 4i + k of qh as their fifth bit (qh = 0 for Q4_1).
// |result| <= 4 * 31 * 128.
__host__ __device__ inline int Q5_1LaneSum(uint32_t codes, uint32_t qh, int lane, uint32_t act) {
  const uint32_t fifth = (((qh >> (4 * lane)) & 0xFu) * 0x00204081u) & 0x01010101u;  // bit k -> byte k
  return Dot4(SpreadNibbles(codes) | (fifth << 4), act);
}

// Q4_0 / IQ4_NL, lane i's 4 products of one block (its share of the block's int32 sum, which
// the group adds up): values of the 4 codes in the 2 bytes of `codes` . the 4 activations.
template <bool kIQ4>
__host__ __device__ inline int Table4LanePart(uint32_t codes, uint32_t act) {
  const uint32_t c = SpreadNibbles(codes);
  const uint32_t values = kIQ4 ? Lookup4(c, IQ4Word(0), IQ4Word(1), IQ4Word(2), IQ4Word(3))
                               : Lookup4(c, Q4_0Word(0), Q4_0Word(1), Q4_0Word(2), Q4_0Word(3));
  return Dot4(values, act);
}

// IQ4_XS, lane i's int32 of one block (the CPU's lane i of IQ4_XSRowsKernel, iq4_rows.cc): sum
// over sub-blocks j of (ls[j] - 32) * (codebook values . group j), 4 elements each. w: the lane's
// code words; h: the block's header (d | scales_h << 16, scales_l). |result| <= 8 * 32 * 4 * 127^2
// < 2^24, so its f32 conversion is exact.
__host__ __device__ inline int IQ4_XSLaneSum(uint4 w, uint2 h, uint4 a0, uint4 a1) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t values = IQ4Lookup4((words[j / 2] >> (4 * (j % 2))) & 0x0f0f0f0fu);
    const int ls = static_cast<int>(((h.y >> (4 * j)) & 0xFu) | (((h.x >> (16 + 2 * j)) & 3u) << 4));
    sum += (ls - 32) * Dot4(values, act[j]);
  }
  return sum;
}

// IQ2_XXS, lane i's int32 of one block (the CPU's lane i of IQ2_XXSRowsKernel, iq2_rows.cc): sum
// over sub-blocks j of (2 ls + 1) * (signed grid bytes . group j), 4 elements each: half i % 2 of
// grid point index[j] of group i / 2, each byte negated where its sign bit is set (7 sign bits at
// 7 (i / 2) of the word, the eighth their parity). index: the lane's 8 grid indices; w0, w1: the
// block's 8 sign and scale words; grid: the 256 grid points (kIQ2_XXSGrid). |result| < 2^23.
__host__ __device__ inline int IQ2_XXSLaneSum(uint2 index, uint4 w0, uint4 w1, int lane, const uint64_t* grid, uint4 a0,
                                              uint4 a1) {
  const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const int group = lane / 2, half = lane % 2;
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t g = ((j < 4 ? index.x : index.y) >> (8 * (j % 4))) & 0xffu;
    const uint32_t points = static_cast<uint32_t>(grid[g] >> (32 * half));
    const uint32_t s7 = (words[j] >> (7 * group)) & 127u;
    const uint32_t signs = ((s7 | (static_cast<uint32_t>(Popc(s7) & 1) << 7)) >> (4 * half)) & 0xFu;
    // Bit k of signs -> 0xff in byte k; a byte b negated as (b ^ 0xff) + 1, which carries into
    // no other byte (b is 8, 25 or 43).
    const uint32_t mask = ((signs * 0x00204081u) & 0x01010101u) * 0xffu;
    const uint32_t values = (points ^ mask) + (mask & 0x01010101u);
    sum += static_cast<int>(2 * (words[j] >> 28) + 1) * Dot4(values, act[j]);
  }
  return sum;
}

// The 4 grid bytes `points`, byte k negated where bit k of `signs` (< 16) is set: (b ^ 0xff) + 1,
// which carries into no other byte (grid bytes are > 0).
__host__ __device__ inline uint32_t NegateBytes(uint32_t points, uint32_t signs) {
  const uint32_t mask = ((signs * 0x00204081u) & 0x01010101u) * 0xffu;  // bit k -> 0xff in byte k
  return (points ^ mask) + (mask & 0x01010101u);
}

// The 4 grid bytes `points` of half `half` of a group of 8 whose 7 sign bits are s7 (the eighth
// their parity), each negated where its sign bit is set.
__host__ __device__ inline uint32_t SignedGridWord(uint32_t points, uint32_t s7, int half) {
  return NegateBytes(points, ((s7 | (static_cast<uint32_t>(Popc(s7) & 1) << 7)) >> (4 * half)) & 0xFu);
}

// IQ2_XS, lane i's int32 of one block (the CPU's lane i, iq2_rows.cc): over sub-blocks j,
// (2 ls + 1) * (signed grid bytes . group j), ls the nibble of scales[j] of the lane's 16
// elements (low for lanes 0-3), the grid point half i % 2 of the word's 9-bit index (grid: the 512
// points, kIQ2_XSGrid). w: the lane pair's 8 words. |result| < 2^23.
__host__ __device__ inline int IQ2_XSLaneSum(uint4 w, uint2 sc, int lane, const uint64_t* grid, uint4 a0, uint4 a1) {
  const uint32_t pairs[4] = {w.x, w.y, w.z, w.w};
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const int half = lane % 2, nibble = lane >= 4 ? 4 : 0;
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t v = (pairs[j / 2] >> (16 * (j % 2))) & 0xffffu;
    const uint32_t points = static_cast<uint32_t>(grid[v & 511u] >> (32 * half));
    const int ls = static_cast<int>(((j < 4 ? sc.x : sc.y) >> (8 * (j % 4) + nibble)) & 0xFu);
    sum += (2 * ls + 1) * Dot4(SignedGridWord(points, v >> 9, half), act[j]);
  }
  return sum;
}

// IQ3_XXS, lane i's int32 of one block (the CPU's lane i, iq3_rows.cc): over sub-blocks j,
// (2 ls + 1) * (signed grid bytes . group j), the grid point (4 elements, grid: kIQ3_XXSGrid) of
// index byte j, the signs of group i / 2 half i % 2 and ls from sub-block j's word. index: the
// lane's 8 indices; w0, w1: the block's 8 words. |result| < 2^23.
__host__ __device__ inline int IQ3_XXSLaneSum(uint2 index, uint4 w0, uint4 w1, int lane, const uint32_t* grid, uint4 a0,
                                              uint4 a1) {
  const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const int group = lane / 2, half = lane % 2;
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t g = ((j < 4 ? index.x : index.y) >> (8 * (j % 4))) & 0xffu;
    const uint32_t s7 = (words[j] >> (7 * group)) & 127u;
    sum += static_cast<int>(2 * (words[j] >> 28) + 1) * Dot4(SignedGridWord(grid[g], s7, half), act[j]);
  }
  return sum;
}

// IQ3_S, lane i's int32 of one block (the CPU's lane i of IQ3_SRowsKernel, iq3_rows.cc): over
// sub-blocks j, (2 ls + 1) * (signed grid bytes . group j), the grid point (4 elements, grid:
// kIQ3_SGrid) of index byte j with bit i of qh[j] as its ninth bit, each byte negated where its bit
// of nibble i % 2 of sign byte j is set, ls nibble j of the scales. index: the lane's 8 index
// bytes; signs: its pair's 8 sign bytes; qh: the block's 8 qh bytes; scales: its 4 scale bytes.
// |result| <= 8 * 31 * 4 * 15 * 127 < 2^21.
__host__ __device__ inline int IQ3_SLaneSum(uint2 index, uint2 signs, uint2 qh, uint32_t scales, int lane,
                                            const uint32_t* grid, uint4 a0, uint4 a1) {
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const int half = lane % 2;
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const int shift = 8 * (j % 4);
    const uint32_t low = ((j < 4 ? index.x : index.y) >> shift) & 0xffu;
    const uint32_t high = ((j < 4 ? qh.x : qh.y) >> (shift + lane)) & 1u;
    const uint32_t s = ((j < 4 ? signs.x : signs.y) >> (shift + 4 * half)) & 0xFu;
    const int ls = static_cast<int>((scales >> (4 * j)) & 0xFu);
    sum += (2 * ls + 1) * Dot4(NegateBytes(grid[low | (high << 8)], s), act[j]);
  }
  return sum;
}

// IQ2_S, lane i's int32 of one block (the CPU's lane i, iq2_rows.cc): IQ2_XS's sum with a 10-bit
// index, index byte j of the lane pair's words with bits 2 (i / 2), 2 (i / 2) + 1 of qh[j] above
// it (grid: the 1024 points, kIQ2_SGrid), and the bytes of grid point half i % 2 negated where
// their bits of nibble i % 2 of sign byte j are set. w: the lane pair's 8 index bytes (x, y) and 8
// sign bytes (z, w); h: the block's qh (x, y) and scales (z, w). |result| < 2^23.
__host__ __device__ inline int IQ2_SLaneSum(uint4 w, uint4 h, int lane, const uint64_t* grid, uint4 a0, uint4 a1) {
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const int group = lane / 2, half = lane % 2, nibble = lane >= 4 ? 4 : 0;
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const int shift = 8 * (j % 4);
    const uint32_t low = ((j < 4 ? w.x : w.y) >> shift) & 0xffu;
    const uint32_t high = ((j < 4 ? h.x : h.y) >> (shift + 2 * group)) & 3u;
    const uint32_t points = static_cast<uint32_t>(grid[low | (high << 8)] >> (32 * half));
    const uint32_t s = ((j < 4 ? w.z : w.w) >> (shift + 4 * half)) & 0xFu;
    const int ls = static_cast<int>(((j < 4 ? h.z : h.w) >> (shift + nibble)) & 0xFu);
    sum += (2 * ls + 1) * Dot4(NegateBytes(points, s), act[j]);
  }
  return sum;
}

// IQ1_S, lane i's int32 of one block (the CPU's lane i, iq1_rows.cc): over sub-blocks j,
// (2 ls + 1) * (grid values . group j), the values (-1, 0, 1 as int8) half i % 2 of the grid point
// (grid: the 2048 points, kIQ1_SGrid) of index byte j with bits 3 (i / 2) .. 3 (i / 2) + 2 of qh[j]
// above it, ls bits 12-14 of qh[j]. index: the lane pair's 8 index bytes; h: the block's 8 qh
// (u16 2k in the low half of word k). |result| <= 8 * 15 * 4 * 127 < 2^16.
__host__ __device__ inline int IQ1_SLaneSum(uint2 index, uint4 h, int lane, const uint64_t* grid, uint4 a0, uint4 a1) {
  const uint32_t act[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
  const uint32_t words[4] = {h.x, h.y, h.z, h.w};
  const int group = lane / 2, half = lane % 2;
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t qh = (words[j / 2] >> (16 * (j % 2))) & 0xffffu;
    const uint32_t low = ((j < 4 ? index.x : index.y) >> (8 * (j % 4))) & 0xffu;
    const uint32_t values = static_cast<uint32_t>(grid[low | (((qh >> (3 * group)) & 7u) << 8)] >> (32 * half));
    sum += static_cast<int>(2 * ((qh >> 12) & 7u) + 1) * Dot4(values, act[j]);
  }
  return sum;
}

// IQ1_S, the offsets' one int32 of a block (the CPU's sum_offsets): over sub-blocks j,
// +-(2 ls + 1) * (bsums[2j] + bsums[2j + 1]), minus where bit 15 of qh[j] is set. h: the block's
// qh as for IQ1_SLaneSum; b0, b1: its bsums[0..7], bsums[8..15] (int16 pairs). |result| < 2^19.
__host__ __device__ inline int IQ1_SOffsetSum(uint4 h, uint4 b0, uint4 b1) {
  const uint32_t words[4] = {h.x, h.y, h.z, h.w};
  const uint32_t pairs[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
  int sum = 0;
  for (int j = 0; j < 8; ++j) {
    const uint32_t qh = (words[j / 2] >> (16 * (j % 2))) & 0xffffu;
    const int ls = static_cast<int>(2 * ((qh >> 12) & 7u) + 1);
    const int pair = static_cast<int16_t>(pairs[j] & 0xffffu) + static_cast<int16_t>(pairs[j] >> 16);
    sum += (qh & 0x8000u ? -ls : ls) * pair;
  }
  return sum;
}

// Q6_K, lane i's int32 of one block (the CPU's sumi lane i): over halves h and groups k = 0..3 of
// the half, sc[8h + 2k + (i >= 4)] * (codes . group 4h + k), 4 elements each, less the -32 offset
// of the codes, 32 * (sc[2i] * bsums[2i] + sc[2i + 1] * bsums[2i + 1]) (the CPU takes it out
// per lane the same way). ql: the lane's words (ql runs 0..3); qh: its qh words (halves 0, 1);
// sc: the block's 16 int8 scales; a0, a1: activation words of groups 0..3, 4..7; bs: bsums[2i],
// bsums[2i + 1]. |result| may pass 2^24: its f32 conversion rounds, as the CPU's does.
__host__ __device__ inline int Q6_KLaneSum(uint4 ql, uint2 qh, uint4 sc, uint4 a0, uint4 a1, int lane, uint32_t bs) {
  constexpr uint32_t kLow = 0x0f0f0f0fu, kBits45 = 0x30303030u;
  const int hi = lane >= 4 ? 1 : 0;  // lanes 4..7 hold the second 16 elements of each group
  // Codes: low nibble | 2 high bits moved to bits 4, 5 (blocks.h), byte by byte.
  const uint32_t q00 = (ql.x & kLow) | ((qh.x << 4) & kBits45);
  const uint32_t q01 = (ql.y & kLow) | ((qh.x << 2) & kBits45);
  const uint32_t q02 = ((ql.x >> 4) & kLow) | (qh.x & kBits45);
  const uint32_t q03 = ((ql.y >> 4) & kLow) | ((qh.x >> 2) & kBits45);
  const uint32_t q10 = (ql.z & kLow) | ((qh.y << 4) & kBits45);
  const uint32_t q11 = (ql.w & kLow) | ((qh.y << 2) & kBits45);
  const uint32_t q12 = ((ql.z >> 4) & kLow) | (qh.y & kBits45);
  const uint32_t q13 = ((ql.w >> 4) & kLow) | ((qh.y >> 2) & kBits45);
  const int sum = ByteS(sc.x, hi) * Dot4(q00, a0.x) + ByteS(sc.x, 2 + hi) * Dot4(q01, a0.y) +
                  ByteS(sc.y, hi) * Dot4(q02, a0.z) + ByteS(sc.y, 2 + hi) * Dot4(q03, a0.w) +
                  ByteS(sc.z, hi) * Dot4(q10, a1.x) + ByteS(sc.z, 2 + hi) * Dot4(q11, a1.y) +
                  ByteS(sc.w, hi) * Dot4(q12, a1.z) + ByteS(sc.w, 2 + hi) * Dot4(q13, a1.w);
  const int word = lane >> 1;
  const uint32_t sw = word == 0 ? sc.x : word == 1 ? sc.y : word == 2 ? sc.z : sc.w;
  const int k = 2 * (lane & 1);
  const int offset =
      ByteS(sw, k) * static_cast<int16_t>(bs & 0xffffu) + ByteS(sw, k + 1) * static_cast<int16_t>(bs >> 16);
  return sum - 32 * offset;
}

}  // namespace mer::cuda
