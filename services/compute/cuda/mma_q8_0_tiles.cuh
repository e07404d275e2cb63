// The fast form's multi-token Q8_0 products (MultiTokenQ8_0::kMmaFast) as shared-memory tiles: a
// block of 4 warps takes 64 mma rows x kBN tokens, and both operands pass through shared memory a
// run of 4 blocks (128 columns) at a time, 3 runs in flight (cp.async), so that each weight byte
// loaded serves kBN tokens and each activation byte 64 rows. mma_q8_0.cuh's warp kernels load
// each warp's 16 rows straight into registers and reuse them for at most 8 tiles of 8 tokens; on a
// 1,024-token chunk they ran at ~35 clocks per mma and SM (docs/cuda.md, "Multi-token kernels").
//
// Results: the fast form's, bit for bit. Each output is one f32 chain over its row's blocks in
// order, acc = fma(d_w * d_a, int32 block sum, acc) (MmaQ8_0Block<false>), exactly as the warp
// kernels compute it: which kernel runs changes the speed, never a bit.
//
// Warps: 2 x 2, each 32 rows (2 mma m-tiles) x kBN / 2 tokens (kBN / 16 n-tiles). A staged row
// (weights or a token's activations) is the run's 128 quants in the interleaved layout
// (device_layout.cuh) at a stride of 192 bytes, so that the two rows of a quarter warp's 16-byte
// loads fall in different halves of the banks; then the weights' 4 f16 scales and the tokens' 4
// f32 scales of the run. Rows and tokens are given as addresses in a header of the shared memory
// (nullptr: a zero row), which the caller writes before MmaTileDots and may rewrite after it.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/mma_q8_0.cuh"
#include "services/compute/cuda/staged_dots.cuh"
#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {

inline constexpr int kMmaTileRows = 64;      // mma rows per block
inline constexpr int kMmaTileThreads = 128;  // 4 warps

template <int kBN>
struct MmaTileSmem {
  static_assert(kBN == 32 || kBN == 64, "tokens per tile");
  static constexpr int kNTiles = kBN / 16;  // n-tiles of 8 tokens per warp
  static constexpr int kRowStride = 192;
  static constexpr int kQuantBytes = (kMmaTileRows + kBN) * kRowStride;
  static constexpr int kBufferBytes = kQuantBytes + kMmaTileRows * 8 + kBN * 16;
  static constexpr int kHeaderBytes = (kMmaTileRows + kBN) * 2 * static_cast<int>(sizeof(void*));
  static constexpr int kStages = 3;  // runs in flight: the one computed and the next two loading
  static constexpr int kBytes = kHeaderBytes + kStages * kBufferBytes;

  // The header: each mma row's quants and f16 scales, each token's quants and f32 scales (the
  // starts of their rows; nullptr: zero).
  const uint8_t** row_q;
  const __half** row_s;
  const uint8_t** tok_q;
  const float** tok_s;
  uint8_t* buffers;

  __device__ explicit MmaTileSmem(uint8_t* smem)
      : row_q(reinterpret_cast<const uint8_t**>(smem)),
        row_s(reinterpret_cast<const __half**>(row_q + kMmaTileRows)),
        tok_q(reinterpret_cast<const uint8_t**>(row_s + kMmaTileRows)),
        tok_s(reinterpret_cast<const float**>(tok_q + kBN)),
        buffers(smem + kHeaderBytes) {}
};

__device__ inline void CpAsync8(void* smem, const void* global) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(s), "l"(global) : "memory");
}
__device__ inline void CpAsyncCommit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ inline void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Issues the copies of run i (columns 128 i .. 128 i + 127) of every row and token into `buffer`.
template <int kBN>
__device__ inline void MmaTileStage(const MmaTileSmem<kBN>& s, uint8_t* buffer, int i) {
  using S = MmaTileSmem<kBN>;
  for (int idx = threadIdx.x; idx < (kMmaTileRows + kBN) * 8; idx += kMmaTileThreads) {
    const int r = idx / 8, c = idx % 8;
    const uint8_t* src = r < kMmaTileRows ? s.row_q[r] : s.tok_q[r - kMmaTileRows];
    uint8_t* dst = buffer + r * S::kRowStride + c * 16;
    if (src != nullptr)
      CpAsync16(dst, src + int64_t(i) * 128 + c * 16);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
  for (int idx = threadIdx.x; idx < kMmaTileRows + kBN; idx += kMmaTileThreads) {
    if (idx < kMmaTileRows) {
      uint8_t* dst = buffer + S::kQuantBytes + idx * 8;
      if (s.row_s[idx] != nullptr)
        CpAsync8(dst, s.row_s[idx] + 4 * i);
      else
        *reinterpret_cast<uint2*>(dst) = make_uint2(0, 0);
    } else {
      const int t = idx - kMmaTileRows;
      uint8_t* dst = buffer + S::kQuantBytes + kMmaTileRows * 8 + t * 16;
      if (s.tok_s[t] != nullptr)
        CpAsync16(dst, s.tok_s[t] + 4 * i);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// The products of run i's 4 blocks for this warp's rows and tokens, added to acc.
template <int kBN>
__device__ inline void MmaTileRun(const uint8_t* buffer, float (&acc)[2][kBN / 16][1][4]) {
  using S = MmaTileSmem<kBN>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  const int row_base = (warp / 2) * 32, tok_base = (warp % 2) * (kBN / 2);
  const uint8_t* quants = buffer;
  const uint8_t* w_scales = buffer + S::kQuantBytes;
  const float* t_scales = reinterpret_cast<const float*>(buffer + S::kQuantBytes + kMmaTileRows * 8);
  // a[mt]: rows gid and gid + 8 of m-tile mt at lane tig, then at lane tig + 4 (the A registers).
  uint4 a[2][4];
  float ws[2][2][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
    const int r0 = row_base + mt * 16 + gid, r8 = r0 + 8;
    a[mt][0] = *reinterpret_cast<const uint4*>(quants + r0 * S::kRowStride + 16 * tig);
    a[mt][1] = *reinterpret_cast<const uint4*>(quants + r8 * S::kRowStride + 16 * tig);
    a[mt][2] = *reinterpret_cast<const uint4*>(quants + r0 * S::kRowStride + 64 + 16 * tig);
    a[mt][3] = *reinterpret_cast<const uint4*>(quants + r8 * S::kRowStride + 64 + 16 * tig);
    Q8_0RunScales(*reinterpret_cast<const uint2*>(w_scales + r0 * 8), ws[mt][0]);
    Q8_0RunScales(*reinterpret_cast<const uint2*>(w_scales + r8 * 8), ws[mt][1]);
  }
#pragma unroll
  for (int nt = 0; nt < S::kNTiles; ++nt) {
    const int t = tok_base + nt * 8;
    const uint8_t* x_row = quants + (kMmaTileRows + t + gid) * S::kRowStride;
    const uint4 x_lo = *reinterpret_cast<const uint4*>(x_row + 16 * tig);
    const uint4 x_hi = *reinterpret_cast<const uint4*>(x_row + 64 + 16 * tig);
    const float4 s0 = *reinterpret_cast<const float4*>(t_scales + (t + 2 * tig) * 4);
    const float4 s1 = *reinterpret_cast<const float4*>(t_scales + (t + 2 * tig + 1) * 4);
    const float st0[4] = {s0.x, s0.y, s0.z, s0.w}, st1[4] = {s1.x, s1.y, s1.z, s1.w};
#pragma unroll
    for (int j = 0; j < 4; ++j)  // the blocks in order: each output's chain
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        MmaQ8_0Block<false>(Word(a[mt][0], j), Word(a[mt][1], j), Word(a[mt][2], j), Word(a[mt][3], j), Word(x_lo, j),
                            Word(x_hi, j), ws[mt][0][j], ws[mt][1][j], st0[j], st1[j], tig, acc[mt][nt]);
  }
}

// Zeroes a tile's accumulators.
template <int kBN>
__device__ inline void ZeroTile(float (&acc)[2][kBN / 16][1][4]) {
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kBN / 16; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][0][i] = 0.0f;
}

// Steps 0 .. steps - 1 through kStages shared-memory buffers of kBufferBytes each, step i in buffer
// i % kStages: stage(buffer, i) issues step i's copies (cp.async, or zero stores), compute(buffer,
// i) reads them once every thread's are in place. One commit group per step (empty past the last),
// so that waiting for all but the newest kStages - 1 groups is waiting for step i. Every thread of
// the block calls it; it returns after a __syncthreads.
template <int kStages, int kBufferBytes, typename Stage, typename Compute>
__device__ inline void PipelineSteps(uint8_t* buffers, int steps, Stage stage, Compute compute) {
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < steps) stage(buffers + i * kBufferBytes, i);
    CpAsyncCommit();
  }
  for (int i = 0; i < steps; ++i) {
    const int ahead = i + kStages - 1;
    if (ahead < steps) stage(buffers + (ahead % kStages) * kBufferBytes, ahead);
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    __syncthreads();  // step i's copies (and zero stores) by every thread are in place
    compute(buffers + (i % kStages) * kBufferBytes, i);
    __syncthreads();  // every warp is done with this buffer before step i + kStages fills it
  }
}

// The block's 64 x kBN products over `cols` columns (a multiple of 128) of the rows and tokens in
// the header. acc[mt][nt][0][i]: C element i of the warp's m-tile mt and n-tile nt: rows
// (warp / 2) * 32 + mt * 16 + gid (+ 8 for i >= 2), tokens (warp % 2) * kBN / 2 + nt * 8 + 2 tig
// + i % 2. Every thread of the block calls it after the header is written and a __syncthreads;
// it returns after a __syncthreads, so the header may be rewritten at once.
template <int kBN>
__device__ inline void MmaTileDots(const MmaTileSmem<kBN>& s, int64_t cols, float (&acc)[2][kBN / 16][1][4]) {
  using S = MmaTileSmem<kBN>;
  ZeroTile<kBN>(acc);
  PipelineSteps<S::kStages, S::kBufferBytes>(
      s.buffers, static_cast<int>(cols / 128), [&](uint8_t* buffer, int i) { MmaTileStage(s, buffer, i); },
      [&](const uint8_t* buffer, int) { MmaTileRun<kBN>(buffer, acc); });
}

// Calls out(row, token, v) for each of this thread's outputs of MmaTileDots: v at row (of the
// block's 64) and token (of its kBN).
template <int kBN, typename Out>
__device__ inline void ForEachTileOutput(const float (&acc)[2][kBN / 16][1][4], Out out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < kBN / 16; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c)  // C element c: row gid (+ 8 for c >= 2), token 2 tig + c % 2
        out((warp / 2) * 32 + mt * 16 + gid + (c >= 2 ? 8 : 0), (warp % 2) * (kBN / 2) + nt * 8 + 2 * tig + c % 2,
            acc[mt][nt][0][c]);
}

// The Q8_0 tiles for the kernels of mma_tile_kernels.cuh: where a row's and a token's bytes start.
template <int kBN_>
struct Q8_0Tiles {
  static constexpr int kBN = kBN_;
  using Smem = MmaTileSmem<kBN>;
  static constexpr int kBytes = Smem::kBytes;
  // Blocks per SM, the kernels' launch bounds: at 3 (<= 168 registers) ptxas spills the 64-token
  // tiles' expert kernels; the mat-vec kernel runs at 3 with either.
  static constexpr int kExpertBlocksPerSm = kBN == 64 ? 2 : 3;
  static constexpr int kMatvecBlocksPerSm = 3;
  // Points mma row m at row r of w (r < 0: a zero row).
  __device__ static void SetRow(const Smem& s, int m, const DevMatrix& w, int64_t r) {
    const RowRef ref = r >= 0 ? MatrixRow<kDevQ8_0>(w, r) : RowRef{};
    s.row_q[m] = ref.q;
    s.row_s[m] = ref.s;
  }
  // Points token i at activation row t (t < 0: a zero token).
  __device__ static void SetToken(const Smem& s, int i, const DevAct& act, int64_t t) {
    s.tok_q[i] = t >= 0 ? act.data + t * ActRowBytes(act.type, act.stride) : nullptr;
    s.tok_s[i] = t >= 0 ? act.scales + t * (act.stride / 32) : nullptr;
  }
  __device__ static void Dots(const Smem& s, int64_t cols, float (&acc)[2][kBN / 16][1][4]) {
    MmaTileDots(s, cols, acc);
  }
};

// Products the tiles take: whole runs of 4 blocks, and activation rows whose runs and f32 scales
// are 16-byte aligned (a stride of whole runs).
inline bool MmaTilesFit(int type, int64_t cols, int64_t act_stride) {
  return type == kDevQ8_0 && cols > 0 && cols % 128 == 0 && act_stride % 128 == 0;
}
// Tokens per tile for products whose row blocks see `tokens` tokens each (on average).
inline int MmaTileTokens(int64_t tokens) { return tokens >= 48 ? 64 : 32; }
// Calls launch(std::integral_constant<int, kBN>) for MmaTileTokens(tokens).
template <typename Launch>
void WithMmaTileTokens(int64_t tokens, Launch launch) {
  if (MmaTileTokens(tokens) == 64)
    launch(std::integral_constant<int, 64>{});
  else
    launch(std::integral_constant<int, 32>{});
}

}  // namespace mer::cuda
