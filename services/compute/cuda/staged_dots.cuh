// Multi-token Q8_0 products with the weights staged in shared memory (prompts, batches): each
// lane group's 2 weight rows and their scales are copied into shared memory with cp.async, all at
// once, then every activation row of the block is computed from there, NT at a time with those
// rows staged too (StageActRows). The register-staged kernels (GroupDots with NT > 1) keep 2 runs
// per row in flight, about 16 KB per SM, so a 31-token prompt read its ~27 GB of experts at
// ~1 TB/s; here an SM has 100-200 KB in flight. The chains are GroupDots<kDevQ8_0, 2, NT>'s, bit
// for bit. Used by the multi-token expert kernels (moe_experts.cu). Tried for the dense mat-vecs
// with every token in one block: fewer blocks than SMs for Q/K/V, and prompt 1,406 -> 1,237
// tokens/s on the H200, so those keep the register path.
//
// Shared memory, 16-byte chunks: chunk (j, tid) at j * blockDim.x + tid (a warp's 16-byte reads
// of one j are contiguous: no bank conflicts): j < 2 * nr for the runs of 4 blocks (row 0's runs
// 0..nr-1, then row 1's), then StagedScaleChunks(nr) per row for the scales (lane g of a group
// copies chunks g, g + 8, ... of its row's nr * 8 scale bytes); then NT activation rows.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "services/compute/cuda/warp_dot.cuh"

namespace mer::cuda {

inline constexpr int64_t kStagedMaxSmem = 160 * 1024;  // opted in per kernel (SetStagedSmemLimit)

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
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kStagedMaxSmem)));
}

__device__ inline void CpAsync16(void* smem, const void* global) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(global) : "memory");
}
__device__ inline void CpAsyncWaitAll() {
  asm volatile("cp.async.commit_group;" ::: "memory");
  asm volatile("cp.async.wait_group 0;" ::: "memory");
}

// The staged dots of one block: rows (null: this lane group has no row m), n_items activation
// rows; item_of(i) names item i (a token or a pair), act_of(item, &q, &s) gives its activation
// row, epilogue(item, sums) takes the two sums (valid in the group's lane 0). after_copies() runs
// once the weight copies are issued, before anything else is read (a WaitForPredecessor for
// static weights). Every thread of the block must call it, with a block-uniform n_items.
template <int NT, typename AfterCopies, typename ItemOf, typename ActOf, typename Epilogue>
__device__ void StagedDots(uint4* staged, const RowRef (&rows)[2], int64_t cols, AfterCopies after_copies,
                           int n_items, ItemOf item_of, ActOf act_of, Epilogue epilogue) {
  constexpr int G = kGroup<kDevQ8_0>;
  const int tid = threadIdx.x, g = tid % G, nthreads = blockDim.x;
  const int nr = static_cast<int>(cols / 128), sc = StagedScaleChunks(nr);
  const auto chunk = [&](int j, int t) { return staged + int64_t(j) * nthreads + t; };
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    if (rows[m].q == nullptr) continue;
    for (int i = 0; i < nr; ++i) CpAsync16(chunk(m * nr + i, tid), reinterpret_cast<const uint4*>(rows[m].q + int64_t(i) * 128) + g);
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
  for (int p0 = 0; p0 < n_items; p0 += NT) {
    const uint8_t* act_rows[NT];
    const float* act_scales[NT];
    int item[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      item[t] = p0 + t < n_items ? item_of(p0 + t) : -1;
      act_rows[t] = nullptr;
      act_scales[t] = nullptr;
      if (item[t] >= 0) act_of(item[t], &act_rows[t], &act_scales[t]);
    }
    if (p0 > 0) __syncthreads();  // every lane is done with the previous rows
    StageActRows<kDevQ8_0, NT>(act_smem, act_rows, act_scales, cols);
    if (p0 == 0) {
      CpAsyncWaitAll();
      __syncthreads();  // the group's scale chunks were copied by its other lanes
    }
    float acc[2][NT];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[m][t] = 0.0f;
    for (int i = 0; i < nr; ++i) {
      uint4 wq[2];
      float w_s[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        wq[m] = *chunk(m * nr + i, tid);
        // Blocks 4i..4i+3's scales: bytes 8i..8i+7 of the row's, in chunk i / 2, copied by lane
        // (i / 2) % 8 of this group as its chunk (i / 2) / 8.
        const int c = i / 2;
        const uint2 sv = reinterpret_cast<const uint2*>(chunk(2 * nr + m * sc + c / G, tid - g + c % G))[i % 2];
        const __half2 s01 = *reinterpret_cast<const __half2*>(&sv.x), s23 = *reinterpret_cast<const __half2*>(&sv.y);
        w_s[m][0] = __low2float(s01); w_s[m][1] = __high2float(s01);
        w_s[m][2] = __low2float(s23); w_s[m][3] = __high2float(s23);
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (act_rows[t] == nullptr) continue;
        const uint4 aq = reinterpret_cast<const uint4*>(act_rows[t] + int64_t(i) * 128)[g];
        const float4 a4 = reinterpret_cast<const float4*>(act_scales[t])[i];
        const float as[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int m = 0; m < 2; ++m) acc[m][t] = Q8_0RunStep(wq[m], w_s[m], aq, as, acc[m][t]);
      }
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float sums[2] = {GroupReduce<kDevQ8_0>(acc[0][t]), GroupReduce<kDevQ8_0>(acc[1][t])};
      if (g == 0 && item[t] >= 0) epilogue(item[t], sums);
    }
  }
}

}  // namespace mer::cuda
