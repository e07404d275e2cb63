// The fast form's tiled products as kernels, over any tile format with Q8_0Tiles's interface
// (mma_q8_0_tiles.cuh: Q8_0 rows and activations; mma_kquant_tiles.cuh: Q4_K and Q6_K rows, Q8_K
// activations): the experts' gate/up with SwiGLU and down (the expert kernels pick their experts
// and pairs as GroupExpert does), and the dense mat-vecs of several tokens. A block of 4 warps
// takes 64 mma rows x Tiles::kBN tokens; the accumulators are MmaTileDots's.
#pragma once

#include <algorithm>
#include <cstdint>

#include "services/compute/cuda/expert_group.cuh"
#include "services/compute/cuda/ggml_math.cuh"
#include "services/compute/cuda/matvec.cuh"
#include "services/compute/cuda/mma_q8_0_tiles.cuh"
#include "services/compute/cuda/moe_experts.cuh"
#include "services/compute/cuda/multi_token_kernels.h"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/staged_dots.cuh"

namespace mer::cuda {

// The tokens each row block of an expert pass (n pairs per expert at most) sees on average: what
// picks a pass's tile width (MmaTileTokens).
inline int64_t MeanExpertTokens(const ExpertArgs& a, int n) { return int64_t(n) * a.k / std::max(a.u_count, 1); }

// Whether the fast form's tiles take a mat-vec of n_tokens tokens (FastTiles: kAlways any,
// kByShape kMmaTiledMinTokens or more, kOff none); whether the fast form is chosen is the caller's.
inline bool FastTilesTakeMatvec(int n_tokens) {
  const FastTiles tiles = FastTilesChoice();
  return tiles == FastTiles::kAlways || (tiles == FastTiles::kByShape && n_tokens >= kMmaTiledMinTokens);
}

// Gate/up: a block's 64 mma rows are 4 m-tiles of 8 gate rows and the same 8 up rows (32 rows of
// each), so that one thread holds both sums of each SwiGLU, as in GateUpMmaKernel; down: 64 rows.
// The block takes its expert's pairs kBN at a time.
inline constexpr int kGateUpTileRows = kMmaTileRows / 2;  // rows of gate (and of up) per block

// Points the header's tokens at pairs p0 .. p0 + kBN - 1 of the group (a zero token past its end):
// activation row pair / per_row. Threads kMmaTileRows .. kMmaTileRows + kBN - 1 write it.
template <typename Tiles>
__device__ inline void TileTokens(const typename Tiles::Smem& s, const DevAct& act, const int32_t* pairs, int p0,
                                  int n_pairs, int per_row) {
  const int i = static_cast<int>(threadIdx.x) - kMmaTileRows;
  if (i < 0 || i >= Tiles::kBN) return;
  Tiles::SetToken(s, i, act, p0 + i < n_pairs ? __ldcg(pairs + p0 + i) / per_row : -1);
}

template <typename Tiles>
__global__ void __launch_bounds__(kMmaTileThreads, Tiles::kExpertBlocksPerSm)
    GateUpTiledKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* h) {
  constexpr int kBN = Tiles::kBN;
  extern __shared__ uint4 tiled_smem[];
  WaitForPredecessor();
  AllowDependents();  // after the wait, as GateUpKernel
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const typename Tiles::Smem s(reinterpret_cast<uint8_t*>(tiled_smem));
  const int64_t r_base = int64_t(blockIdx.x) * kGateUpTileRows;
  if (threadIdx.x < kMmaTileRows) {  // mma row m: m-tile m / 16, gate (m % 16 < 8) or up row r
    const int m = threadIdx.x;
    const int64_t r = r_base + (m / 16) * 8 + m % 8;
    const DevMatrix w{a.type, a.n_ff, a.n_embd, base + (m % 16 < 8 ? 0 : a.up_offset)};
    Tiles::SetRow(s, m, w, r < a.n_ff ? r : -1);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gid = lane / 4, tig = lane % 4;
  for (int p0 = 0; p0 < n_pairs; p0 += kBN) {
    TileTokens<Tiles>(s, act, pairs, p0, n_pairs, a.k);
    __syncthreads();
    float acc[2][kBN / 16][1][4];
    Tiles::Dots(s, a.n_embd, acc);
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int64_t r = r_base + ((warp / 2) * 2 + mt) * 8 + gid;
      if (r >= a.n_ff) continue;
#pragma unroll
      for (int nt = 0; nt < kBN / 16; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {  // token 2 tig + c: gate in C element c, up in c + 2
          const int i = (warp % 2) * (kBN / 2) + nt * 8 + 2 * tig + c;
          if (p0 + i < n_pairs)
            h[int64_t(__ldcg(pairs + p0 + i)) * a.n_ff + r] = SwiGlu(acc[mt][nt][0][c], acc[mt][nt][0][c + 2]);
        }
    }
  }
}

// As DownMmaKernel, the block finds its expert and rows before the wait.
template <typename Tiles>
__global__ void __launch_bounds__(kMmaTileThreads, Tiles::kExpertBlocksPerSm)
    DownTiledKernel(const __grid_constant__ ExpertArgs a, DevAct act, float* out) {
  constexpr int kBN = Tiles::kBN;
  extern __shared__ uint4 tiled_smem[];
  AllowDependents();
  int n_pairs;
  const int32_t* pairs;
  const uint8_t* base = GroupExpert(a, &n_pairs, &pairs);
  if (base == nullptr) return;
  const typename Tiles::Smem s(reinterpret_cast<uint8_t*>(tiled_smem));
  const int64_t r_base = int64_t(blockIdx.x) * kMmaTileRows;
  if (threadIdx.x < kMmaTileRows) {
    const DevMatrix down{a.down_type, a.n_embd, a.n_ff, base + a.down_offset};
    const int64_t r = r_base + threadIdx.x;
    Tiles::SetRow(s, threadIdx.x, down, r < a.n_embd ? r : -1);
  }
  WaitForPredecessor();
  for (int p0 = 0; p0 < n_pairs; p0 += kBN) {
    TileTokens<Tiles>(s, act, pairs, p0, n_pairs, 1);
    __syncthreads();
    float acc[2][kBN / 16][1][4];
    Tiles::Dots(s, a.n_ff, acc);
    ForEachTileOutput<kBN>(acc, [&](int row, int i, float v) {
      const int64_t r = r_base + row;
      if (r < a.n_embd && p0 + i < n_pairs) out[int64_t(__ldcg(pairs + p0 + i)) * a.n_embd + r] = v;
    });
  }
}

template <typename Tiles>
void LaunchGateUpTiled(const ExpertArgs& a, const DevAct& act, float* h, cudaStream_t s) {
  const auto kernel = GateUpTiledKernel<Tiles>;
  static const bool limit_set = (SetStagedSmemLimit(kernel), true);  // one per instance
  (void)limit_set;
  LaunchPdl(kernel, dim3((a.n_ff + kGateUpTileRows - 1) / kGateUpTileRows, a.u_count), dim3(kMmaTileThreads),
            Tiles::kBytes, s, a, act, h);
}

template <typename Tiles>
void LaunchDownTiled(const ExpertArgs& a, const DevAct& act, float* out, cudaStream_t s) {
  const auto kernel = DownTiledKernel<Tiles>;
  static const bool limit_set = (SetStagedSmemLimit(kernel), true);  // one per instance
  (void)limit_set;
  LaunchPdl(kernel, dim3((a.n_embd + kMmaTileRows - 1) / kMmaTileRows, a.u_count), dim3(kMmaTileThreads), Tiles::kBytes,
            s, a, act, out);
}

// Several tokens of the rows of up to Args::o's matrices (one type, one column count), concatenated:
// 64 rows (a tile may span two matrices) x kBN tokens per block, tokens along the grid's x. Args:
// the mat-vec launches' arguments (o, row_begin, n_outputs, act, n_tokens).
template <typename Tiles, typename Args>
__global__ void __launch_bounds__(kMmaTileThreads, Tiles::kMatvecBlocksPerSm)
    MatvecTiledKernel(const __grid_constant__ Args args) {
  constexpr int kBN = Tiles::kBN;
  extern __shared__ uint4 tiled_smem[];
  AllowDependents();
  const typename Tiles::Smem s(reinterpret_cast<uint8_t*>(tiled_smem));
  const int64_t row_base = int64_t(blockIdx.y) * kMmaTileRows;
  const int64_t total = args.row_begin[args.n_outputs];
  const int t0 = blockIdx.x * kBN, n = min(kBN, args.n_tokens - t0);
  // The matrix and row of concatenated row g, or -1 past the end.
  const auto locate = [&](int64_t g, int* m) -> int64_t {
    if (g >= total) return -1;
    *m = 0;
    while (*m + 1 < args.n_outputs && g >= args.row_begin[*m + 1]) ++*m;
    const int64_t row = g - args.row_begin[*m];
    return row < args.o[*m].w.rows ? row : -1;
  };
  if (threadIdx.x < kMmaTileRows) {
    int m = 0;
    const int64_t row = locate(row_base + threadIdx.x, &m);
    Tiles::SetRow(s, threadIdx.x, args.o[m].w, row);
  } else if (const int i = threadIdx.x - kMmaTileRows; i < kBN) {
    Tiles::SetToken(s, i, args.act, i < n ? t0 + i : -1);
  }
  WaitForPredecessor();
  __syncthreads();
  float acc[2][kBN / 16][1][4];
  Tiles::Dots(s, args.o[0].w.cols, acc);
  ForEachTileOutput<kBN>(acc, [&](int r, int i, float v) {
    int m = 0;
    const int64_t row = locate(row_base + r, &m);
    if (i >= n || row < 0) return;
    const MatvecOutput& o = args.o[m];
    const int64_t at = int64_t(t0 + i) * o.out_stride + row;
    o.out[at] = o.residual != nullptr ? __fadd_rn(o.residual[at], v) : v;
  });
}

template <typename Tiles, typename Args>
void LaunchMatvecTiled(const Args& args, int64_t total_rows, cudaStream_t stream) {
  constexpr int kBN = Tiles::kBN;
  const auto kernel = MatvecTiledKernel<Tiles, Args>;
  static const bool limit_set = (SetStagedSmemLimit(kernel), true);  // one per instance
  (void)limit_set;
  const dim3 grid(static_cast<unsigned>((args.n_tokens + kBN - 1) / kBN),
                  static_cast<unsigned>((total_rows + kMmaTileRows - 1) / kMmaTileRows));
  LaunchPdl(kernel, grid, dim3(kMmaTileThreads), Tiles::kBytes, stream, args);
}

}  // namespace mer::cuda
