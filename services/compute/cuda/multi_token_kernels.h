// Which kernels the cuda backend's multi-token Q8_0 products take: a setting of the whole process
// (no CUDA headers here, so that the backend factory can set it).
#pragma once

namespace mer::cuda {

// Which kernels take the multi-token Q8_0 products (prompts, batches: the dense mat-vecs and the
// experts). Single-token products (decode) always give the CPU's bits.
//   kAuto:     the CPU's bits from whichever of the two exact kinds below is faster for the shape
//              (the default): the tensor cores for mat-vecs of kMmaAutoMinTokens tokens or more
//              and for experts with kMmaAutoMinPairs pairs each or more on average, dp4a below;
//   kDp4a:     integer dot products (staged_dots.cuh), the CPU's bits;
//   kMmaExact: tensor cores (mma_q8_0.cuh), the CPU's bits: 8 masked mmas per 32-block, since the
//              CPU's integer sums are 4-product lane sums;
//   kMmaFast:  tensor cores, one mma per 32-block: each output is one f32 chain over the blocks of
//              fma(d_w * d_a, int32 block sum, acc) instead of the CPU's 8 lane chains and their
//              tree, so results differ from the CPU's in the last bits of each product, and (as any
//              change of rounding does, through the Q8_0 activations) by more in the logits
//              (docs/cuda.md, "Multi-token numerics"). The Q4_K, Q5_K and Q6_K products of several
//              tokens may take the tensor cores too under this choice only (KQuantTilesEnabled;
//              mma_kquant_tiles.cuh: one mma per sub-block, one f32 chain per output over the
//              256-blocks); under the others they take the dp4a kernels, the CPU's bits.
// MER_CUDA_MMA=auto (or unset), 0 (dp4a), 1 (exact) or fast, read at the first call. Process-wide;
// SetMultiTokenQ8_0 is for tests and benchmarks.
enum class MultiTokenQ8_0 { kAuto, kDp4a, kMmaExact, kMmaFast };
// On the H100, 30B geometry, per layer: a 77-token step's Q/K/V and output projection 77 and 71 us
// on the tensor cores against 81 and 78 with dp4a, its experts (~5 pairs each) 252 against 241 us
// for gate/up; a 512-token prompt's (~32 pairs each) 472 against 607 (docs/benchmarks.md).
inline constexpr int kMmaAutoMinTokens = 64, kMmaAutoMinPairs = 16;
MultiTokenQ8_0 MultiTokenQ8_0Kernels();
void SetMultiTokenQ8_0(MultiTokenQ8_0 kernels);
// Whether the multi-token Q8_0 products give the CPU's bits (every choice but kMmaFast).
inline bool MultiTokenQ8_0Exact() { return MultiTokenQ8_0Kernels() != MultiTokenQ8_0::kMmaFast; }
// Tiles of 8 tokens that the fast kernels stage and compute per pass over their weight rows: 2, 4
// or 8 (MER_CUDA_MMA_TILES, read at the first call; the exact kernels always take 2, their 8 chains
// per output leave no registers for more). More tiles read each weight row fewer times for an
// expert of many pairs or a long prompt chunk, at the cost of shared memory. The results do not
// depend on it: each output is the same chain over the blocks.
inline constexpr int kMmaFastTilesDefault = 4;
int MmaFastTiles();
// Where the fast form takes its products in shared-memory tiles (mma_q8_0_tiles.cuh: 64 rows x 32
// or 64 tokens per block) rather than in the warp kernels of mma_q8_0.cuh; the same bits either
// way, only the speed differs:
//   kOff:     never;
//   kByShape: the experts, and mat-vecs of kMmaTiledMinTokens tokens or more (the default);
//   kAlways:  every product of several tokens that fits them (for measuring that threshold).
// MER_CUDA_MMA_TILED = 0, 1 or all, read at the first call; SetFastTiles is for tests and benchmarks.
enum class FastTiles { kOff, kByShape, kAlways };
// On the H100 (30B geometry, a 64-stream batch of 77 tokens a step, ~5 pairs per expert): 21.66 ms
// a step with the warp kernels, 24.41 with the mat-vecs in tiles, 23.96 with the mat-vecs and the
// experts (2 runs of columns in flight); with 3 in flight, 20.51 with the experts in tiles, 22.57
// with the mat-vecs too. A 512-token prompt ran 1.20x faster with every product in tiles.
inline constexpr int kMmaTiledMinTokens = 128;
FastTiles FastTilesChoice();
void SetFastTiles(FastTiles tiles);
// Whether the fast form takes the Q4_K, Q5_K and Q6_K products of several tokens on the tensor cores
// (mma_kquant_tiles.cuh) rather than the dp4a kernels: MER_CUDA_MMA_KQUANT=1, read at the first
// call; off by default until cuda_kernels_test KQuantFastTilesMatchCpu and cuda_engine_test
// FastTensorCoresDriftLikeAnyRounding have run them on a GPU (their arithmetic and fragments pass
// kquant_layout_test on the host). SetKQuantTiles is for tests and benchmarks.
bool KQuantTilesEnabled();
void SetKQuantTiles(bool enabled);

}  // namespace mer::cuda
