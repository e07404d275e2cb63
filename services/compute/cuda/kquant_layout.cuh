// K-quant weights (Q4_K, Q6_K) and their Q8_K activations in device memory, and the per-lane
// integer arithmetic of their dot products. Everything here is __host__ __device__ and free of
// device intrinsics, so that a host test (tests/unit/compute/kquant_layout_test.cc) can run a
// lane group's arithmetic on the CPU against the CPU kernels.
//
// The CPU kernels (common/quant/q4_k_rows.cc, q6_k_rows.cc; avx2, and avx512 with the same
// integers) keep 8 int32 lanes per weight row; lane i covers bytes 4i..4i+3 of every 32-element
// run of a 256-block ("group" g = element / 32, 8 groups). One GPU lane group of 8 lanes computes
// one row, lane i holding CPU lane i, so each lane needs word i of every group; the layouts put
// those words next to each other (LaneInterleave) so a lane reads them with one 16-byte load.
//
// Weights, a matrix of n = rows * cols / 256 blocks, block b = row * (cols / 256) + block in row;
// the same bytes as the file's blocks, regrouped (kquant_repack.cuh converts on upload):
//   Q4_K (144 bytes a block): qs [n][128] at 0, lane i's 16 bytes at 16i = qs[32c + 4i .. +3]
//        for chunks c = 0..3; headers [n][16] at 128n = d, dmin, scales[12] as in the file.
//   Q6_K (210 bytes a block): ql [n][128] at 0, lane i's 16 bytes = ql[32r + 4i .. +3] for runs
//        r = 0..3; qh [n][64] at 128n, lane i's 8 bytes = qh[4i .. +3], qh[32 + 4i .. +3];
//        scales [n][16] at 192n; d f16 [n] at 208n.
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
inline constexpr int kQ6_KBlockBytes = 210;

// Where byte j of a region of 32 * words bytes goes when each of the 8 lanes owns bytes
// 4i..4i+3 of every 32-byte run: run j / 32 becomes word j / 32 of lane (j % 32) / 4's
// 4 * words contiguous bytes.
__host__ __device__ constexpr int LaneInterleave(int j, int words) {
  return (j % 32) / 4 * (4 * words) + (j / 32) * 4 + j % 4;
}

// Byte offsets in a Q4_K matrix of n blocks.
__host__ __device__ constexpr int64_t Q4_KQsOffset(int64_t b, int lane) { return b * 128 + 16 * lane; }
__host__ __device__ constexpr int64_t Q4_KHeaderOffset(int64_t n, int64_t b) { return 128 * n + 16 * b; }
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
