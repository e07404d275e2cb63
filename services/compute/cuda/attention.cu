#include "services/compute/cuda/attention.cuh"

#include <cfloat>

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/ggml_math.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxChunks = 16;  // head_dim <= 1024: 64-element chunks of ggml_vec_dot_f32
constexpr int kCellsInFlight = 4;
constexpr size_t kMaxSmemScoreBytes = 40 * 1024;  // within the 48 KB of dynamic shared memory without opt-in
constexpr unsigned kAll = 0xffffffffu;

// ReduceAdd16 (ggml_math.cuh) over the 16 lanes of each half-warp; the sum in the half's lane 0.
__device__ inline float HalfWarpReduceAdd16(float v) {
  v = __fadd_rn(__shfl_down_sync(kAll, v, 8, 16), v);  // a[i] = v[i + 8] + v[i]
  v = __fadd_rn(__shfl_down_sync(kAll, v, 4, 16), v);  // b[i] = a[i + 4] + a[i]
  v = __fadd_rn(v, __shfl_down_sync(kAll, v, 2, 16));  // b0 + b2, b1 + b3
  return __fadd_rn(v, __shfl_down_sync(kAll, v, 1, 16));
}

// The head's q in the CPU's lane order: lane l holds elements c * 64 + l (q_lo) and
// c * 64 + 32 + l (q_hi) of each whole 64-element chunk c.
__device__ __forceinline__ void LoadHeadQ(const float* q, int n_chunks, float (&q_lo)[kMaxChunks],
                                          float (&q_hi)[kMaxChunks]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int c = 0; c < kMaxChunks; ++c) {
    if (c >= n_chunks) break;
    q_lo[c] = q[c * 64 + lane];
    q_hi[c] = q[c * 64 + 32 + lane];
  }
}

// Scores of cells [begin, end) of one (token, head) into x[j - begin], a warp per cell (lane l
// holding the CPU's lanes l and l + 32, ReduceAcc64 by shuffles); returns the largest, valid in
// lane 0 of each warp. q_lo/q_hi: the head's q in the CPU's lane order.
// k_new: the last cell's k (end - 1) from there instead of the cache (fused_rope), or nullptr.
__device__ __forceinline__ float ScoreCells(const AttentionArgs& a, int64_t base, const float* q,
                                            const float (&q_lo)[kMaxChunks], const float (&q_hi)[kMaxChunks],
                                            int n_chunks, int begin, int end, float scale, float* x,
                                            const float* k_new = nullptr) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int HD = a.head_dim, KD = a.n_head_kv * HD;
  // kCellsInFlight cells per warp per pass (j, j + kWarps, ...): their K loads are issued
  // together, so a pass costs one L2/DRAM round trip instead of one per cell.
  float local_max = -FLT_MAX;
  for (int j0 = begin + warp; j0 < end; j0 += kWarps * kCellsInFlight) {
    float lo[kCellsInFlight], hi[kCellsInFlight];  // the CPU's lanes `lane` and `lane + 32`
#pragma unroll
    for (int u = 0; u < kCellsInFlight; ++u) lo[u] = hi[u] = 0.0f;
      // Two chunks of every cell loaded before the first fma that needs one (an fma waiting on a
      // load would hold back the loads behind it); per cell the fma chain is the CPU's, in order.
#pragma unroll
    for (int c0 = 0; c0 < kMaxChunks; c0 += 2) {
      if (c0 >= n_chunks) break;
      float k_lo[kCellsInFlight][2], k_hi[kCellsInFlight][2];
#pragma unroll
      for (int u = 0; u < kCellsInFlight; ++u) {
        const int j = j0 + u * kWarps;
        const float* kr = k_new != nullptr && j == end - 1 ? k_new : a.k_cache + base + int64_t(j < end ? j : 0) * KD;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int c = c0 + cc;
          const bool ok = j < end && c < n_chunks;
          k_lo[u][cc] = ok ? kr[c * 64 + lane] : 0.0f;
          k_hi[u][cc] = ok ? kr[c * 64 + 32 + lane] : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kCellsInFlight; ++u)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          if (c0 + cc >= n_chunks) break;
          lo[u] = fmaf(k_lo[u][cc], q_lo[c0 + cc], lo[u]);
          hi[u] = fmaf(k_hi[u][cc], q_hi[c0 + cc], hi[u]);
        }
    }
#pragma unroll
    for (int u = 0; u < kCellsInFlight; ++u) {
      const int j = j0 + u * kWarps;  // uniform per warp
      if (j >= end) break;
      // ReduceAcc64: v[l] = (s[l] + s[32 + l]) + (s[16 + l] + s[48 + l]), then ReduceAdd16(v).
      float v = __fadd_rn(lo[u], hi[u]);
      v = __fadd_rn(v, __shfl_down_sync(kAll, v, 16));
      v = HalfWarpReduceAdd16(v);
      if (lane == 0) {
        const float* kr = k_new != nullptr && j == end - 1 ? k_new : a.k_cache + base + int64_t(j) * KD;
        for (int i = n_chunks * 64; i < HD; ++i) v = fmaf(kr[i], q[i], v);  // the tail, in order
        const float sc = __fmul_rn(v, scale);
        x[j - begin] = sc;
        local_max = fmaxf(local_max, sc);
      }
    }
  }
  return local_max;
}

// ScoreCells with a thread per cell (decode): the thread runs the CPU's 64 lanes of its cell
// itself (DotF32GgmlVec4's arithmetic: the same chains, ReduceAcc64, then the tail) instead of a
// warp sharing them by shuffles. A warp per cell makes a pass of kWarps * kCellsInFlight cells
// cost an L2 round trip plus 4 cells' 5 dependent shuffles, ~2,600 cycles on the H200 (~6.5 us of
// a 160-cell decode attention's ~12.6, by clock64 stamps); here kThreads cells take one pass.
// q and k_new 16-byte aligned, head_dim a multiple of 4. Returns the largest score of the warp,
// valid in every lane.
__device__ __forceinline__ float ScoreCellsByThread(const AttentionArgs& a, int64_t base, const float* q, int begin,
                                                    int end, float scale, float* x, const float* k_new) {
  const int HD = a.head_dim, KD = a.n_head_kv * HD;
  float local_max = -FLT_MAX;
  for (int j = begin + static_cast<int>(threadIdx.x); j < end; j += kThreads) {
    const float* kr = k_new != nullptr && j == end - 1 ? k_new : a.k_cache + base + int64_t(j) * KD;
    const float sc = __fmul_rn(DotF32GgmlVec4(kr, q, HD), scale);
    x[j - begin] = sc;
    local_max = fmaxf(local_max, sc);
  }
  for (int o = 16; o > 0; o >>= 1) local_max = fmaxf(local_max, __shfl_xor_sync(kAll, local_max, o));
  return local_max;
}

// fused_rope's prologue (attention.cuh): QkNormRopeKernel's values for token t's q head h and its
// KV head's new k (threads [0, HD) and [HD, 2 * HD)) into q_new and k_new, the new v into v_new
// (shared memory); the first block of each KV head appends k and v to the cache. The squares are
// summed in double by a tree instead of in order: a double sum of float squares is exact up to
// its last bits in any order, which the float mean does not see.
// What a thread of NormRopeHead needs that no kernel of the step writes: the norm's weight and the
// RoPE table's entries (the step's input copy, made before its first kernel), loaded before the
// wait (in DRAM by then, since the experts streamed through L2 since the last layer read them).
struct RopeInputs {
  float nw, c, sn;
  int32_t pos, seq;  // token t's
};
__device__ __forceinline__ RopeInputs LoadRopeInputs(const AttentionArgs& a, int t) {
  const QkNormRopeArgs& r = a.rope;
  const int tid = threadIdx.x, HD = a.head_dim, half = HD / 2;
  const bool in = tid < 2 * HD, is_q = tid < HD;
  const int d = tid % HD, i = d < half ? d : d - half;
  RopeInputs v;
  v.nw = !in ? 0.0f : (is_q ? r.q_norm : r.k_norm)[d];
  v.c = in ? r.rope_cos[int64_t(t) * half + i] : 0.0f;
  v.sn = in ? r.rope_sin[int64_t(t) * half + i] : 0.0f;
  v.pos = r.pos[t];
  v.seq = r.seq[t];
  return v;
}

__device__ void NormRopeHead(const AttentionArgs& a, int t, int h, int kvh, const RopeInputs& ri, float* q_new,
                             float* k_new, float* v_new) {
  const QkNormRopeArgs& r = a.rope;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int HD = a.head_dim, KD = a.n_head_kv * HD, half = HD / 2;
  const bool in = tid < 2 * HD, is_q = tid < HD;
  const int d = tid % HD, i = d < half ? d : d - half;
  // Every load first (one round trip).
  const float x = !in ? 0.0f : is_q ? r.q[(int64_t(t) * a.n_head + h) * HD + d] : r.k[int64_t(t) * KD + kvh * HD + d];
  const float nw = ri.nw, c = ri.c, sn = ri.sn;
  if (tid < HD) v_new[tid] = r.v[int64_t(t) * KD + kvh * HD + tid];
  double sq = static_cast<double>(__fmul_rn(x, x));
  for (int o = min(HD, 32) / 2; o > 0; o >>= 1) sq += __shfl_xor_sync(kAll, sq, o);  // within the HD lanes
  __shared__ double red[kWarps];
  __shared__ float normed[kThreads];  // q's, then k's
  if (lane == 0) red[warp] = sq;
  __syncthreads();
  double total = sq;
  if (HD >= 32) {
    total = 0.0;
    for (int w = 0; w < HD / 32; ++w) total += red[(is_q ? 0 : HD / 32) + w];
  }
  const float mean = static_cast<float>(total / static_cast<double>(HD));
  const float scale = 1.0f / sqrtf(mean + r.eps);
  if (in) normed[tid] = __fmul_rn(__fmul_rn(x, scale), nw);
  __syncthreads();
  if (in) {
    const float* head = normed + (is_q ? 0 : HD);
    const float x0 = head[i], x1 = head[i + half];
    const float out = RopeNeoxAt(d, half, x0, x1, c, sn);
    (is_q ? q_new : k_new)[d] = out;
    if (h % (a.n_head / a.n_head_kv) == 0) {
      const int64_t cell = (int64_t(ri.seq) * r.max_ctx + ri.pos) * KD + kvh * HD + d;
      if (is_q)
        r.v_cache[cell] = v_new[d];
      else
        r.k_cache[cell] = out;
    }
  }
  __syncthreads();
}

// A decode step's KV cells before the new one (written by earlier steps, so readable before the
// wait) pulled into L2 while the Q/K/V mat-vec still runs, by n_head_kv extra blocks of the
// fused launch, one per KV head (a thread per 128-byte line): the score and V passes then wait on
// L2 rather than DRAM, where the experts streamed through since the last step left them. Extra
// blocks rather than a prologue of the head blocks: those are at 255 registers, and any code
// before their wait pushed them into spills. The step inputs (pos, seq) are copied before the
// step's first kernel.
__device__ __forceinline__ void PrefetchKvHead(const AttentionArgs& a, int t, int kvh) {
  const int HD = a.head_dim, KD = a.n_head_kv * HD;
  const int lines_per_row = (HD * 4 + 127) / 128, n_cached = a.pos[t];
  const int64_t base = int64_t(a.seq[t]) * a.max_ctx * KD + kvh * HD;
  for (int i = threadIdx.x; i < n_cached * 2 * lines_per_row; i += blockDim.x) {
    const int cell = i / (2 * lines_per_row), line = i % (2 * lines_per_row);
    const float* row = (line < lines_per_row ? a.k_cache : a.v_cache) + base + int64_t(cell) * KD;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(row + (line % lines_per_row) * 32));
  }
}

// The CPU engine's attention (CpuEngine::Attention) operation for operation: scores by
// ggml_vec_dot_f32, ggml's soft_max over the KV window rounded up to 16, and softmax . V in
// ggml_vec_dot_f32's 64 fma lanes (cell j in lane j % 64), reduced as ReduceAcc64. Scores: a warp
// per cell, lane l holding the CPU's lanes l and l + 32 (ReduceAcc64 by shuffles), or with
// kFusedRope (decode) a thread per cell (ScoreCellsByThread); softmax groups: a half-warp per
// group of 16. With kFusedRope the launch has n_head_kv more blocks than heads (PrefetchKvHead).
// kFusedRope: a.fused_rope, a template parameter so that the plain kernel keeps its 128 registers
// (2 blocks per SM for prompt steps' many blocks; the fused one is for decode's few).
template <bool kFusedRope>
__global__ void __launch_bounds__(kThreads) AttentionKernel(const AttentionArgs a, bool scores_in_smem) {
  extern __shared__ float smem_scores[];  // AttentionScoresStride(max_ctx) floats when scores_in_smem
  __shared__ float red_f[kWarps];
  __shared__ float inv_sum;
  AllowDependents();
  if (kFusedRope && blockIdx.y >= a.n_head) {  // (block-uniform) a prefetch block
    PrefetchKvHead(a, blockIdx.x, blockIdx.y - a.n_head);
    return;
  }
  const int t = blockIdx.x, h = blockIdx.y;
  // fused_rope: the step's inputs (pos, seq, the RoPE table) and the norms' weights before the wait.
  RopeInputs rope_in{};
  if constexpr (kFusedRope) rope_in = LoadRopeInputs(a, t);
  WaitForPredecessor();
  const int pos_t = kFusedRope ? rope_in.pos : a.pos[t], seq_t = kFusedRope ? rope_in.seq : a.seq[t];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int HD = a.head_dim, KD = a.n_head_kv * HD, kvh = h / (a.n_head / a.n_head_kv);
  const int n_pos = pos_t + 1;
  const int n_groups = (n_pos + 15) / 16;
  // fused_rope: the head's q and the new cell's k and v, normed and rotated here.
  // (16-byte aligned: ScoreCellsByThread reads q_new and k_new as float4s)
  __shared__ __align__(16) float q_new[kFusedRope ? kThreads / 2 : 1];
  __shared__ __align__(16) float k_new[kFusedRope ? kThreads / 2 : 1];
  __shared__ float v_new[kFusedRope ? kThreads / 2 : 1];
  if constexpr (kFusedRope) NormRopeHead(a, t, h, kvh, rope_in, q_new, k_new, v_new);
  const float* q = kFusedRope ? q_new : a.q + (int64_t(t) * a.n_head + h) * HD;
  const int64_t base = int64_t(seq_t) * a.max_ctx * KD + kvh * HD;
  float* x = scores_in_smem ? smem_scores : a.scores + (int64_t(t) * a.n_head + h) * AttentionScoresStride(a.max_ctx);
  float* group_sum = x + a.max_ctx;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));

  float local_max;
  if (kFusedRope && HD % 4 == 0) {
    local_max = ScoreCellsByThread(a, base, q, 0, n_pos, scale, x, k_new);
  } else {
    const int n_chunks = HD / 64;
    float q_lo[kMaxChunks], q_hi[kMaxChunks];
    LoadHeadQ(q, n_chunks, q_lo, q_hi);
    local_max = ScoreCells(a, base, q, q_lo, q_hi, n_chunks, 0, n_pos, scale, x, kFusedRope ? k_new : nullptr);
  }
  if (lane == 0) red_f[warp] = local_max;
  __syncthreads();  // also orders the x[] writes above before the reads below (same block)
  float max = red_f[0];
  for (int w = 1; w < kWarps; ++w) max = fmaxf(max, red_f[w]);
  // Half-warp hw of warp w takes group 2 * w + hw, then every 2 * kWarps-th (uniform per warp).
  for (int g0 = 2 * warp; g0 < n_groups; g0 += 2 * kWarps) {
    const int gi = g0 + lane / 16, k = gi * 16 + lane % 16;
    const bool in = gi < n_groups && k < n_pos;
    const float e = in ? GgmlExpf(__fsub_rn(x[k], max)) : 0.0f;
    if (in) x[k] = e;
    const float sum = HalfWarpReduceAdd16(e);
    if (lane % 16 == 0 && gi < n_groups) group_sum[gi] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int gi = 0; gi < n_groups; ++gi) sum += static_cast<double>(group_sum[gi]);
    inv_sum = static_cast<float>(1.0 / sum);
  }
  __syncthreads();
  const float inv = inv_sum;
  for (int j = threadIdx.x; j < n_pos; j += kThreads) x[j] = __fmul_rn(x[j], inv);
  __syncthreads();

  // With fused_rope the new cell (n_pos - 1, always in the last pass) has its v in v_new.
  const int cached = kFusedRope ? n_pos - 1 : n_pos;
  for (int d = threadIdx.x; d < HD; d += kThreads) {
    const float* v = a.v_cache + base + d;
    // Cell j goes to lane j % 64 in increasing j; 64 cells per pass keep 64 loads in flight.
    float lanes[64];
#pragma unroll
    for (int l = 0; l < 64; ++l) lanes[l] = 0.0f;
    int j0 = 0;
    for (; j0 + 64 < n_pos; j0 += 64) {  // the last pass, partial or not, below
#pragma unroll
      for (int l = 0; l < 64; ++l) lanes[l] = fmaf(v[int64_t(j0 + l) * KD], x[j0 + l], lanes[l]);
    }
    // The last, partial pass: every load issued before the first fma (a load behind a branch
    // would wait for the fma before it), cells past n_pos leaving their lane as it is.
    float vv[64];
#pragma unroll
    for (int l = 0; l < 64; ++l) vv[l] = j0 + l < cached ? v[int64_t(j0 + l) * KD] : j0 + l < n_pos ? v_new[d] : 0.0f;
#pragma unroll
    for (int l = 0; l < 64; ++l) {
      const bool in = j0 + l < n_pos;
      const float f = fmaf(vv[l], in ? x[j0 + l] : 0.0f, lanes[l]);
      lanes[l] = in ? f : lanes[l];
    }
    const float o = ReduceAcc64(lanes);
    // With out_act, whole warps hold whole Q8_0 blocks of the row (AttentionConvertsOutput).
    if (a.out_act.data != nullptr)
      StoreAct(a.out_act, t, int64_t(h) * HD + d, o);
    else
      a.out[(int64_t(t) * a.n_head + h) * HD + d] = o;
  }
}

// Split-K (attention.cuh): partials of split s of (t, h) at scores + (t * n_head + h) *
// AttentionScoresStride(max_ctx) + s * SplitPartialFloats: the split's max score, its sum of
// exp(score - max), then sum_j exp(score_j - max) v_j per dimension.
__host__ __device__ inline int64_t SplitPartialFloats(int head_dim) { return head_dim + 2; }
// Splits a launch has per (token, head): as many partials as a (token, head)'s scratch holds.
__host__ __device__ inline int SplitsLaunched(int head_dim, int max_ctx) {
  return static_cast<int>(AttentionScoresStride(max_ctx) / SplitPartialFloats(head_dim));
}
// Query heads one split block takes: a KV head's group (GQA), or a part of a larger one.
constexpr int kMaxGroup = 16;
// A context of n_pos cells is cut into equal splits of at least this many cells, as many as were
// launched: short contexts still spread over several blocks per KV head, long ones over all.
constexpr int kMinSplitCells = 32;
static_assert(kAttentionSplitCells == kThreads, "the split kernel scores a cell per thread");
struct SplitRange {
  int used, cells;  // splits in use, cells per split (the last one may be shorter or empty)
};
__device__ inline SplitRange SplitRangeOf(int n_pos, int launched) {
  const int used = min(launched, (n_pos + kMinSplitCells - 1) / kMinSplitCells);
  return {used, (n_pos + used - 1) / used};
}

// A block per (token, KV head (part of its group), split): the split's K and V rows are read once
// for every query head of the group. Scores a thread per cell (all the block's heads at once),
// then each head's max and sum of exps, then V a thread per dimension and part of the cells.
__global__ void __launch_bounds__(kThreads) AttentionSplitKernel(const AttentionArgs a) {
  __shared__ __align__(16) float q_s[kMaxGroup * kThreads];  // the heads' q; later the V parts
  __shared__ float x[kMaxGroup][kAttentionSplitCells];
  __shared__ float red[kMaxGroup][kWarps];
  __shared__ float head_max[kMaxGroup];
  AllowDependents();
  WaitForPredecessor();
  const int t = blockIdx.x, group = a.n_head / a.n_head_kv, parts_of_group = (group + kMaxGroup - 1) / kMaxGroup;
  const int kvh = blockIdx.y / parts_of_group, g_first = (blockIdx.y % parts_of_group) * kMaxGroup;
  const int ng = min(kMaxGroup, group - g_first), h0 = kvh * group + g_first;  // heads h0 .. h0 + ng - 1
  const int n_pos = a.pos[t] + 1;
  const SplitRange r = SplitRangeOf(n_pos, gridDim.z);
  const int begin = blockIdx.z * r.cells, end = min(begin + r.cells, n_pos);
  if (static_cast<int>(blockIdx.z) >= r.used || begin >= end) return;  // the combine skips it too
  const int n = end - begin, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int HD = a.head_dim, KD = a.n_head_kv * HD;
  const float* q = a.q + (int64_t(t) * a.n_head + h0) * HD;  // the ng heads' rows, one after another
  for (int i = tid; i < ng * HD; i += kThreads) q_s[i] = q[i];
  __syncthreads();
  const int64_t base = int64_t(a.seq[t]) * a.max_ctx * KD + kvh * HD;
  const float scale = 1.0f / sqrtf(static_cast<float>(HD));

  float m[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) m[g] = -FLT_MAX;
  if (tid < n) {  // n <= kAttentionSplitCells == kThreads (AttentionSplitSupported)
    const float4* kr = reinterpret_cast<const float4*>(a.k_cache + base + int64_t(begin + tid) * KD);
    float acc[kMaxGroup] = {};
    for (int i0 = 0; i0 < HD / 4; i0 += 8) {  // HD / 4 a multiple of 8; 8 loads in flight
      float4 k4[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) k4[u] = kr[i0 + u];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= ng) break;
        const float4* qg = reinterpret_cast<const float4*>(q_s + g * HD) + i0;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const float4 q4 = qg[u];  // the same address in every lane: a broadcast
          acc[g] = fmaf(k4[u].x, q4.x, fmaf(k4[u].y, q4.y, fmaf(k4[u].z, q4.z, fmaf(k4[u].w, q4.w, acc[g]))));
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= ng) break;
      const float sc = __fmul_rn(acc[g], scale);
      x[g][tid] = sc;
      m[g] = sc;
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= ng) break;
    float v = m[g];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kAll, v, o));
    if (lane == 0) red[g][warp] = v;
  }
  __syncthreads();
  if (tid < ng) {
    float v = red[tid][0];
    for (int w = 1; w < kWarps; ++w) v = fmaxf(v, red[tid][w]);
    head_max[tid] = v;
  }
  __syncthreads();
  float sum[kMaxGroup] = {};
  if (tid < n) {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= ng) break;
      const float e = GgmlExpf(__fsub_rn(x[g][tid], head_max[g]));
      x[g][tid] = e;
      sum[g] = e;
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= ng) break;
    float v = sum[g];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kAll, v, o);
    if (lane == 0) red[g][warp] = v;  // every max was read before the barrier above
  }
  __syncthreads();

  // V: kThreads / HD parts of the cells per dimension, 8 cells' loads in flight per thread; the
  // lanes of a warp share their part, so x[g][j] is a broadcast.
  const int parts = kThreads / HD, d = tid % HD, part = tid / HD;
  float o[kMaxGroup] = {};
  for (int j0 = part; j0 < n; j0 += 8 * parts) {
    float vv[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = j0 + u * parts;
      vv[u] = j < n ? a.v_cache[base + int64_t(begin + j) * KD + d] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int j = j0 + u * parts;
      if (j >= n) break;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= ng) break;
        o[g] = fmaf(vv[u], x[g][j], o[g]);
      }
    }
  }
  // The parts through shared memory (q_s is free: every score was computed before the barriers).
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= ng) break;
    q_s[(part * kMaxGroup + g) * HD + d] = o[g];
  }
  __syncthreads();
  const int64_t stride = AttentionScoresStride(a.max_ctx), split_at = blockIdx.z * SplitPartialFloats(HD);
  for (int i = tid; i < ng * HD; i += kThreads) {
    const int g = i / HD, dd = i % HD;
    float v = q_s[g * HD + dd];
    for (int k = 1; k < parts; ++k) v += q_s[(k * kMaxGroup + g) * HD + dd];
    a.scores[(int64_t(t) * a.n_head + h0 + g) * stride + split_at + 2 + dd] = v;
  }
  if (tid < ng) {
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += red[tid][w];
    float* p = a.scores + (int64_t(t) * a.n_head + h0 + tid) * stride + split_at;
    p[0] = head_max[tid];
    p[1] = total;
  }
}

// One thread per dimension: the token's splits rescaled to their common max and normalised.
__global__ void AttentionCombineKernel(const AttentionArgs a) {
  AllowDependents();
  WaitForPredecessor();
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x, HD = a.head_dim;
  const int n_pos = a.pos[t] + 1;
  const SplitRange r = SplitRangeOf(n_pos, SplitsLaunched(HD, a.max_ctx));
  const int n_splits = min(r.used, (n_pos + r.cells - 1) / r.cells);  // the non-empty ones
  const float* p = a.scores + (int64_t(t) * a.n_head + h) * AttentionScoresStride(a.max_ctx);
  const int64_t stride = SplitPartialFloats(HD);
  float max = -FLT_MAX;
  for (int s = 0; s < n_splits; ++s) max = fmaxf(max, p[s * stride]);
  double sum = 0.0, o = 0.0;
  for (int s = 0; s < n_splits; ++s) {
    const double f = exp(static_cast<double>(p[s * stride]) - max);
    sum += f * p[s * stride + 1];
    o += f * p[s * stride + 2 + d];
  }
  const float out = static_cast<float>(o / sum);
  if (a.out_act.data != nullptr)
    StoreAct(a.out_act, t, int64_t(h) * HD + d, out);  // whole warps: HD % 32 == 0
  else
    a.out[(int64_t(t) * a.n_head + h) * HD + d] = out;
}

}  // namespace

bool AttentionConvertsOutput(int head_dim) { return head_dim % 32 == 0 && head_dim <= kThreads; }

bool AttentionFusesQkNormRope(int head_dim) {
  return head_dim >= 2 && (head_dim & (head_dim - 1)) == 0 && 2 * head_dim <= kThreads;
}

bool AttentionSplitSupported(int head_dim, int max_ctx) {
  if (head_dim % 32 != 0 || head_dim > kThreads || kThreads % head_dim != 0) return false;
  const int launched = SplitsLaunched(head_dim, max_ctx);  // a full context's splits fit a block's cells
  return launched >= 1 && (max_ctx + launched - 1) / launched <= kAttentionSplitCells;
}

void LaunchAttention(const AttentionArgs& args, int n_tokens, cudaStream_t stream) {
  if (args.out_act.data != nullptr && !AttentionConvertsOutput(args.head_dim)) {
    std::fprintf(stderr, "attention: cannot convert the output at head_dim %d\n", args.head_dim);
    std::abort();
  }
  if (args.fused_rope && (args.split || !AttentionFusesQkNormRope(args.head_dim))) {
    std::fprintf(stderr, "attention: cannot fuse the Q/K norm and RoPE at head_dim %d%s\n", args.head_dim,
                 args.split ? " with split-K" : "");
    std::abort();
  }
  if (args.split) {
    if (!AttentionSplitSupported(args.head_dim, args.max_ctx)) {
      std::fprintf(stderr, "attention: split-K unsupported at head_dim %d, max_ctx %d\n", args.head_dim, args.max_ctx);
      std::abort();
    }
    const int group = args.n_head / args.n_head_kv;
    LaunchPdl(AttentionSplitKernel,
              dim3(n_tokens, args.n_head_kv * ((group + kMaxGroup - 1) / kMaxGroup),
                   SplitsLaunched(args.head_dim, args.max_ctx)),
              dim3(kThreads), 0, stream, args);
    LaunchPdl(AttentionCombineKernel, dim3(n_tokens, args.n_head), dim3(args.head_dim), 0, stream, args);
    return;
  }
  // The scores in shared memory where they fit (the softmax and the V pass read them back), else
  // in the global scratch.
  const size_t score_bytes = AttentionScoresStride(args.max_ctx) * sizeof(float);
  const bool in_smem = score_bytes <= kMaxSmemScoreBytes;
  LaunchPdl(args.fused_rope ? AttentionKernel<true> : AttentionKernel<false>,
            dim3(n_tokens, args.n_head + (args.fused_rope ? args.n_head_kv : 0)), dim3(kThreads),
            in_smem ? score_bytes : 0, stream, args, in_smem);
}

}  // namespace mer::cuda
