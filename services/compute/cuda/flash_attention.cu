#include "services/compute/cuda/flash_attention.cuh"

#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;  // each owns 16 query rows (one mma's M)
constexpr int kRows = kFlashAttentionRows;
constexpr int kCells = kFlashAttentionCells;
constexpr unsigned kAll = 0xffffffffu;
static_assert(kRows == kWarps * 16, "a warp per 16 rows");

// Shared memory of a block at head dimension HD: the block's q rows and the K and V tiles (f16
// [kRows or kCells, HD], rows padded by 8 halves so that the 8 rows an ldmatrix phase reads start
// 4 banks apart), and after the last tile, over all three, the output rows (f32 [kRows, HD], rows
// padded by 8 floats so that the float2 stores of a C fragment fall in distinct banks): 34,816
// bytes at head_dim 128, 18,432 at 64. q in shared memory rather than as A fragments held in
// registers, and tiles of 32 cells rather than 64: with either of those the kernel needed 255
// registers at head_dim 128 and spilled (ptxas hoists the V tile's loads above the K tile's
// stores, so both tiles' f32 values are live at once).
template <int HD>
struct Smem {
  static constexpr int kStride = HD + 8;     // halves per q, K or V row
  static constexpr int kOutStride = HD + 8;  // floats per output row
  static constexpr size_t kQBytes = size_t{kRows} * kStride * sizeof(__half);
  static constexpr size_t kKvBytes = 2 * size_t{kCells} * kStride * sizeof(__half);
  static constexpr size_t kOutBytes = size_t{kRows} * kOutStride * sizeof(float);
  static constexpr size_t kBytes = kQBytes + kKvBytes > kOutBytes ? kQBytes + kKvBytes : kOutBytes;
};

// f32 -> f16, clamped to f16's finite range (NaN to -65504): a masked cell's v is multiplied by
// P = 0, and an inf there would make the row NaN.
__device__ __forceinline__ uint16_t ToF16Bits(float x) {
  return __half_as_ushort(__float2half_rn(fminf(fmaxf(x, -65504.0f), 65504.0f)));
}
// Two f16 in one register, lo in the low half (the lower-indexed element of an mma fragment).
__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  return uint32_t{ToF16Bits(lo)} | (uint32_t{ToF16Bits(hi)} << 16);
}

// D += A B, m16n8k16, f16 inputs, f32 accumulators. Fragments (lane = 4 g + q): a0 (row g, cols
// 2q, 2q+1), a1 (row g+8, the same), a2 (row g, cols 2q+8, 2q+9), a3 (row g+8, the same); b0 (rows
// 2q, 2q+1, col g), b1 (rows 2q+8, 2q+9, col g); d0, d1 (row g, cols 2q, 2q+1), d2, d3 (row g+8).
__device__ __forceinline__ void Mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 f16 matrices from shared memory; lanes 8i..8i+7 give the addresses of matrix i's rows
// (16 bytes each). Plain: lane 4g+q receives row g, elements 2q and 2q+1 of each; Trans: elements
// (2q, g) and (2q+1, g) of each as stored (the transpose's row g).
template <bool kTrans>
__device__ __forceinline__ void LdMatrix4(uint32_t (&r)[4], const __half* row) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

// Rows [r0, r0 + kTileRows) of f32 rows `stride` floats apart (src: row 0) into dst as f16 rows,
// rows from `end` on as zeros (K/V: cells past the sequence's last in this step, possibly past the
// cache; q: rows past n_tokens). Every load of the tile before its first store.
template <int HD, int kTileRows>
__device__ __forceinline__ void StageTile(const float* src, int64_t stride, int r0, int end, __half* dst) {
  constexpr int kVecs = HD / 4;  // float4s per row
  constexpr int kPerThread = kTileRows * kVecs / kThreads;
  static_assert(kTileRows * kVecs % kThreads == 0, "whole passes");
  float4 x[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads, cell = idx / kVecs, v = idx % kVecs;
    x[i] = r0 + cell < end ? *reinterpret_cast<const float4*>(src + int64_t(r0 + cell) * stride + v * 4)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int idx = static_cast<int>(threadIdx.x) + i * kThreads, cell = idx / kVecs, v = idx % kVecs;
    *reinterpret_cast<uint2*>(dst + cell * Smem<HD>::kStride + v * 4) =
        make_uint2(PackF16(x[i].x, x[i].y), PackF16(x[i].z, x[i].w));
  }
}

// Block (blockIdx.x = head h, tile of rows [t0, t0 + kRows)); warp w owns rows t0 + 16w .. +15, and
// lane 4g + q of it rows 16w + g (index 0 below) and 16w + g + 8 (index 1). Tiles are launched
// last first, so the blocks with the most cells start first.
template <int HD>
__global__ void __launch_bounds__(kThreads, HD == 64 ? 4 : 2)
    FlashAttentionKernel(const AttentionArgs a, int n_tokens) {
  using S = Smem<HD>;
  extern __shared__ __align__(16) unsigned char smem[];
  __half* qs = reinterpret_cast<__half*>(smem);       // f16 [kRows, kStride]
  __half* ks = qs + kRows * S::kStride;               // f16 [kCells, kStride]
  __half* vs = ks + kCells * S::kStride;              // f16 [kCells, kStride]
  float* os = reinterpret_cast<float*>(smem);         // f32 [kRows, kOutStride], after the last tile
  __shared__ int32_t row_seq[kRows], row_pos[kRows];  // -1 past n_tokens
  AllowDependents();
  WaitForPredecessor();
  const int h = blockIdx.x, t0 = (gridDim.y - 1 - blockIdx.y) * kRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
  const int64_t KD = int64_t(a.n_head_kv) * HD, QD = int64_t(a.n_head) * HD;
  const int kvh = h / (a.n_head / a.n_head_kv);
  if (threadIdx.x < kRows) {
    const int t = t0 + threadIdx.x;
    row_seq[threadIdx.x] = t < n_tokens ? a.seq[t] : -1;
    row_pos[threadIdx.x] = t < n_tokens ? a.pos[t] : -1;
  }

  // The block's q rows (rows past n_tokens zero); the barrier below orders them.
  StageTile<HD, kRows>(a.q + int64_t(h) * HD, QD, t0, n_tokens, qs);
  const int ra = warp * 16 + g, rb = ra + 8;  // the lane's rows within the tile
  // A fragments of the warp's rows from qs: lanes 0-15 give rows 16w + 0..15 at dimensions
  // 16kk + 0..7 (a0, a1), lanes 16-31 the same rows at + 8..15 (a2, a3).
  const __half* q_frag = qs + (warp * 16 + (lane & 15)) * S::kStride + (lane >> 4) * 8;

  // O accumulators: of[n][i] is d-fragment i of dimensions 8n .. 8n + 7 (row index i / 2).
  float of[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) of[n][0] = of[n][1] = of[n][2] = of[n][3] = 0.0f;
  // Per row: the running max of the scores (log2 units) and the lane's share of the running sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  // The existing kernel's scale, 1/sqrt(head_dim), times log2(e): exp(s - max) as exp2.
  const float scale_log2 = (1.0f / sqrtf(static_cast<float>(HD))) * 1.44269504088896341f;
  __syncthreads();  // row_seq, row_pos

  // One pass per sequence of the tile, in increasing id (block-uniform: every thread reads the
  // same shared values).
  for (int prev = -1;;) {
    int s = INT_MAX;
    for (int r = 0; r < kRows; ++r)
      if (row_seq[r] > prev) s = min(s, row_seq[r]);
    if (s == INT_MAX) break;
    prev = s;
    int kv_end = 0;  // one past the last cell any row of s reads
    for (int r = 0; r < kRows; ++r)
      if (row_seq[r] == s) kv_end = max(kv_end, row_pos[r] + 1);
    // The lane's rows' last cell in this pass (-1: not of s, every cell masked), and the warp's.
    const int lim[2] = {row_seq[ra] == s ? row_pos[ra] : -1, row_seq[rb] == s ? row_pos[rb] : -1};
    int warp_lim = max(lim[0], lim[1]);
    for (int o = 16; o > 0; o >>= 1) warp_lim = max(warp_lim, __shfl_xor_sync(kAll, warp_lim, o));
    const int64_t base = int64_t(s) * a.max_ctx * KD + int64_t(kvh) * HD;

    for (int c0 = 0; c0 < kv_end; c0 += kCells) {
      __syncthreads();  // every warp is done with the previous tile
      StageTile<HD, kCells>(a.k_cache + base, KD, c0, kv_end, ks);
      StageTile<HD, kCells>(a.v_cache + base, KD, c0, kv_end, vs);
      __syncthreads();
      if (c0 > warp_lim) continue;  // (warp-uniform) every row of the warp masked: nothing changes

      // S = q K^T: sc[j] is cells c0 + 8j .. + 7. An ldmatrix gives B fragments of cells 16jp ..
      // 16jp + 15 at dimensions 16kk .. + 15: lanes 0-7 cells 16jp + 0..7 dims +0, lanes 8-15 the
      // same cells dims +8, lanes 16-31 cells 16jp + 8..15 likewise (K's rows are B's columns).
      float sc[kCells / 8][4];
#pragma unroll
      for (int j = 0; j < kCells / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk) {
        uint32_t qf[4];
        LdMatrix4<false>(qf, q_frag + kk * 16);
#pragma unroll
        for (int jp = 0; jp < kCells / 16; ++jp) {
          uint32_t b[4];
          LdMatrix4<false>(
              b, ks + (jp * 16 + (lane & 7) + (lane >> 4) * 8) * S::kStride + kk * 16 + ((lane >> 3) & 1) * 8);
          Mma(sc[2 * jp], qf, b[0], b[1]);
          Mma(sc[2 * jp + 1], qf, b[2], b[3]);
        }
      }

      // Scale, mask (a cell past the row's position, or a row of another sequence), row maxima.
      float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < kCells / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int cell = c0 + 8 * j + 2 * qd + (i & 1);
          const float x = cell <= lim[i / 2] ? sc[j][i] * scale_log2 : -INFINITY;
          sc[j][i] = x;
          tmax[i / 2] = fmaxf(tmax[i / 2], x);
        }
      float alpha[2], m_use[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // The 4 lanes of a row (4g .. 4g + 3) share it.
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(kAll, tmax[r], 1));
        tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(kAll, tmax[r], 2));
        const float m_new = fmaxf(m[r], tmax[r]);
        // No cell of the row seen yet: exp2(-inf - 0) = 0 instead of exp2(-inf - -inf) = NaN.
        m_use[r] = m_new == -INFINITY ? 0.0f : m_new;
        alpha[r] = exp2f(m[r] - m_use[r]);
        m[r] = m_new;
        l[r] *= alpha[r];
      }
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        of[n][0] *= alpha[0];
        of[n][1] *= alpha[0];
        of[n][2] *= alpha[1];
        of[n][3] *= alpha[1];
      }
      // P = exp2(S - max) as A fragments: the C fragments of cells 16kk .. + 7 and + 8 .. + 15 are
      // the A fragment of the 16 cells (a0 a1 from sc[2kk], a2 a3 from sc[2kk + 1]).
      uint32_t pf[kCells / 16][4];
#pragma unroll
      for (int kk = 0; kk < kCells / 16; ++kk)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float p[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            p[i] = exp2f(sc[2 * kk + half][i] - m_use[i / 2]);
            l[i / 2] += p[i];
          }
          pf[kk][2 * half] = PackF16(p[0], p[1]);
          pf[kk][2 * half + 1] = PackF16(p[2], p[3]);
        }

        // O += P V. A transposing ldmatrix gives B fragments of dimensions 16np .. 16np + 15 at cells
        // 16kk .. + 15: lanes 0-7 cells +0..7 dims 16np.., lanes 8-15 cells +8..15, lanes 16-31 the
        // same cells at dims 16np + 8.. (V's rows are B's rows).
#pragma unroll
      for (int kk = 0; kk < kCells / 16; ++kk)
#pragma unroll
        for (int np = 0; np < HD / 16; ++np) {
          uint32_t b[4];
          LdMatrix4<true>(b, vs + (kk * 16 + (lane & 15)) * S::kStride + np * 16 + (lane >> 4) * 8);
          Mma(of[2 * np], pf[kk], b[0], b[1]);
          Mma(of[2 * np + 1], pf[kk], b[2], b[3]);
        }
    }
  }

  // The row sums over the 4 lanes of each row, then O / sum into shared memory (rows past
  // n_tokens have sum 0 and are not written out).
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(kAll, l[r], 1);
    l[r] += __shfl_xor_sync(kAll, l[r], 2);
    inv[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
  }
  __syncthreads();  // every warp is done reading qs, ks and vs, which os overlays
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    *reinterpret_cast<float2*>(os + ra * S::kOutStride + 8 * n + 2 * qd) =
        make_float2(of[n][0] * inv[0], of[n][1] * inv[0]);
    *reinterpret_cast<float2*>(os + rb * S::kOutStride + 8 * n + 2 * qd) =
        make_float2(of[n][2] * inv[1], of[n][3] * inv[1]);
  }
  __syncthreads();
  // A warp per row, a lane per element: coalesced, and for Q8_0 a warp per 32-element block, as
  // StoreAct needs.
  for (int r = warp; r < kRows; r += kWarps) {
    const int t = t0 + r;
    if (t >= n_tokens) break;  // warp-uniform
    for (int i = lane; i < HD; i += 32) {
      const float v = os[r * S::kOutStride + i];
      if (a.out_act.data != nullptr)
        StoreAct(a.out_act, t, int64_t(h) * HD + i, v);
      else
        a.out[int64_t(t) * QD + int64_t(h) * HD + i] = v;
    }
  }
}

template <int HD>
void Launch(const AttentionArgs& args, int n_tokens, cudaStream_t stream) {
  static_assert(Smem<HD>::kBytes <= 48 * 1024, "within the dynamic shared memory a launch gets without opting in");
  const dim3 grid(args.n_head, (n_tokens + kRows - 1) / kRows);
  LaunchPdl(FlashAttentionKernel<HD>, grid, dim3(kThreads), Smem<HD>::kBytes, stream, args, n_tokens);
}

}  // namespace

bool FlashAttentionSupported(int head_dim) { return head_dim == 64 || head_dim == 128; }

void LaunchFlashAttention(const AttentionArgs& args, int n_tokens, cudaStream_t stream) {
  if (!FlashAttentionSupported(args.head_dim) || args.split || args.fused_rope ||
      (args.out_act.data != nullptr && !StoreActWrites(args.out_act.type))) {
    std::fprintf(stderr, "flash attention: unsupported at head_dim %d%s%s%s\n", args.head_dim,
                 args.split ? ", split-K" : "", args.fused_rope ? ", fused_rope" : "",
                 args.out_act.data != nullptr ? ", this activation type" : "");
    std::abort();
  }
  if (n_tokens < 1) return;
  if (args.head_dim == 64)
    Launch<64>(args, n_tokens, stream);
  else
    Launch<128>(args, n_tokens, stream);
}

}  // namespace mer::cuda
