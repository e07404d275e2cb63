// Multi-token Q8_0 products with the weights staged in shared memory (prompts, batches): each
// lane group's 2 weight rows and their scales are copied into shared memory with cp.async, all at
// once, then up to NT activation rows at a time are staged too (StageActRows) and computed from
// there in passes of 8, 4, 2 and 1 rows (StagedPass). The register-staged kernels (GroupDots with
// NT > 1) keep 2 runs per row in flight, ~16 KB per SM, and read a prompt's experts at ~1 TB/s;
// here an SM has 100-200 KB in flight. The chains are GroupDots<kDevQ8_0, 2, NT>'s, bit for bit.
// Used by the multi-token expert kernels (moe_experts.cu) and mat-vecs (matvec.cu).
// ncu on the H200 (30B geometry, 31-token prompt) found the earlier version bound by instruction
// issue, not DRAM: gate/up at 18% of the DRAM bandwidth, 8.9 instructions per dp4a, with generic
// (not shared-memory) loads of the activation scales and a branch per absent token; StagedPass
// has neither.
//
// Shared memory, 16-byte chunks: chunk (j, tid) at j * blockDim.x + tid (a warp's 16-byte reads
// of one j are contiguous: no bank conflicts): j < 2 * nr for the runs of 4 blocks (row 0's runs
// 0..nr-1, then row 1's), then StagedScaleChunks(nr) per row for the scales (lane g of a group
// copies chunks g, g + 8, ... of its row's nr * 8 scale bytes); then NT activation rows.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {

inline constexpr int64_t kStagedMaxSmem = 224 * 1024;  // opted in per kernel (SetStagedSmemLimit; sm_90: 227 KB)

__host__ __device__ inline int StagedScaleChunks(int nr) { return (nr / 2 + 7) / 8; }
__host__ __device__ inline int64_t StagedRowsBytes(int64_t cols, int threads) {
  const int nr = static_cast<int>(cols / 128);
  return int64_t(2 * nr + 2 * StagedScaleChunks(nr)) * threads * 16;
}
__host__ __device__ inline int64_t StagedSmemBytes(int64_t cols, int threads, int nt) {
  return StagedRowsBytes(cols, threads) + nt * StagedActBytes<kDevQ8_0>(cols);
}
// cols % 256: whole 16-byte scale chunks per row (nr even).
inline bool StagedFits(int type, int64_t cols, int threads, int nt) {
  return type == kDevQ8_0 && cols % 256 == 0 && StagedSmemBytes(cols, threads, nt) <= kStagedMaxSmem;
}

template <typename Kernel>
void SetStagedSmemLimit(Kernel kernel) {
  CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedMaxSmem)));
}

__device__ inline void CpAsync16(void* smem, const void* global) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(global) : "memory");
}
__device__ inline void CpAsync4(void* smem, const void* global) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(global) : "memory");
}
__device__ inline void CpAsyncWaitAll() {
  asm volatile("cp.async.commit_group;" ::: "memory");
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// One pass of StagedDots over T of the staged activation rows (rows t0..t0 + T - 1 of act, each
// act_chunks 16-byte chunks: the quants, then the f32 block scales at chunk act_scale_chunk0).
// Every address is an offset into shared memory the compiler can see (ld.shared, not generic
// loads), and T is exact: no per-token branch in the loop. acc[m][t] is lane g's chain for
// row m and activation row t0 + t, Q8_0RunStep over the runs in order, as GroupDots'.
template <int T>
__device__ __forceinline__ void StagedPass(const uint4* staged, const uint4* act, int nr, int sc, int t0,
                                           int act_chunks, int act_scale_chunk0, float (&acc)[2][T]) {
  constexpr int G = kGroup<kDevQ8_0>;
  const int tid = threadIdx.x, g = tid % G, nthreads = blockDim.x;
  const uint4* w_row[2] = {staged + tid, staged + int64_t(nr) * nthreads + tid};
  // Row m's scales for run i: bytes 8i..8i+7 of its nr * 8, the group's chunk i / 16 of them
  // (its 8 lanes copied 8 consecutive chunks of each plane: StagedDots).
  const uint8_t* w_scales[2];
#pragma unroll
  for (int m = 0; m < 2; ++m)
    w_scales[m] = reinterpret_cast<const uint8_t*>(staged + int64_t(2 * nr + m * sc) * nthreads + (tid - g));
  const uint4* a_row = act + t0 * act_chunks;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[m][t] = 0.0f;
#pragma unroll 2
  for (int i = 0; i < nr; ++i) {
    uint4 wq[2];
    float w_s[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      wq[m] = w_row[m][i * nthreads];
      Q8_0RunScales(*reinterpret_cast<const uint2*>(w_scales[m] + (i / 16) * nthreads * 16 + (i % 16) * 8), w_s[m]);
    }
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const uint4 aq = a_row[t * act_chunks + i * G + g];
      const float4 a4 = *reinterpret_cast<const float4*>(a_row + t * act_chunks + act_scale_chunk0 + i);
      const float as[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
      for (int m = 0; m < 2; ++m) acc[m][t] = Q8_0RunStep(wq[m], w_s[m], aq, as, acc[m][t]);
    }
  }
}

// The staged dots of one block: rows (null: this lane group has no row m), n_items activation
// rows; item_of(i) names item i (a token or a pair), act_of(item, &q, &s) gives its activation
// row, epilogue(item, sums) takes the two sums (valid in the group's lane 0). after_copies() runs
// once the weight copies are issued, before anything else is read (a WaitForPredecessor for
// static weights). Every thread of the block must call it, with a block-uniform n_items. Up to
// NT rows are staged at a time and computed in passes of 8, 4, 2 and 1 (StagedPass), so that a
// group of n rows costs no work for absent ones; the sums do not depend on how rows are grouped.
template <int NT, typename AfterCopies, typename ItemOf, typename ActOf, typename Epilogue>
__device__ void StagedDots(uint4* staged, const RowRef (&rows)[2], int64_t cols, AfterCopies after_copies, int n_items,
                           ItemOf item_of, ActOf act_of, Epilogue epilogue) {
  static_assert(NT == 1 || NT == 2 || NT == 4 || NT == 8, "passes of 8, 4, 2 and 1 rows");
  constexpr int G = kGroup<kDevQ8_0>;
  const int tid = threadIdx.x, g = tid % G, nthreads = blockDim.x;
  const int nr = static_cast<int>(cols / 128), sc = StagedScaleChunks(nr);
  const auto chunk = [&](int j, int t) { return staged + int64_t(j) * nthreads + t; };
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    if (rows[m].q == nullptr) continue;
    for (int i = 0; i < nr; ++i)
      CpAsync16(chunk(m * nr + i, tid), reinterpret_cast<const uint4*>(rows[m].q + int64_t(i) * 128) + g);
    const uint8_t* s = reinterpret_cast<const uint8_t*>(rows[m].s);
    for (int c = 0; c < sc; ++c)
      if ((c * G + g) * 16 < nr * 8) CpAsync16(chunk(2 * nr + m * sc + c, tid), s + (c * G + g) * 16);
  }
  after_copies();
  if (n_items == 0) {  // (block-uniform) no copies left in flight
    CpAsyncWaitAll();
    return;
  }
  uint4* act_smem = staged + StagedRowsBytes(cols, nthreads) / 16;
  const int act_chunks = static_cast<int>(StagedActBytes<kDevQ8_0>(cols) / 16);
  const int act_scale_chunk0 = static_cast<int>(cols / 16);  // the quants' bytes (StageActRows)
  for (int p0 = 0; p0 < n_items; p0 += NT) {
    const int n = min(NT, n_items - p0);
    const uint8_t* act_rows[NT];
    const float* act_scales[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      act_rows[t] = nullptr;
      act_scales[t] = nullptr;
      if (t < n) act_of(item_of(p0 + t), &act_rows[t], &act_scales[t]);
    }
    if (p0 > 0) __syncthreads();  // every lane is done with the previous rows
    StageActRows<kDevQ8_0, NT>(act_smem, act_rows, act_scales, cols);
    if (p0 == 0) {
      CpAsyncWaitAll();
      __syncthreads();  // the group's scale chunks were copied by its other lanes
    }
    const auto pass = [&](auto size, int t0) {
      constexpr int T = decltype(size)::value;
      float acc[2][T];
      StagedPass<T>(staged, act_smem, nr, sc, t0, act_chunks, act_scale_chunk0, acc);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        const float sums[2] = {GroupReduce<kDevQ8_0>(acc[0][t]), GroupReduce<kDevQ8_0>(acc[1][t])};
        if (g == 0) epilogue(item_of(p0 + t0 + t), sums);
      }
    };
    int t0 = 0;  // block-uniform branches
    if constexpr (NT >= 8)
      if (n - t0 >= 8) {
        pass(std::integral_constant<int, 8>{}, t0);
        t0 += 8;
      }
    if constexpr (NT >= 4)
      if (n - t0 >= 4) {
        pass(std::integral_constant<int, 4>{}, t0);
        t0 += 4;
      }
    if constexpr (NT >= 2)
      if (n - t0 >= 2) {
        pass(std::integral_constant<int, 2>{}, t0);
        t0 += 2;
      }
    if (n - t0 >= 1) pass(std::integral_constant<int, 1>{}, t0);
  }
}

}  // namespace mer::cuda
