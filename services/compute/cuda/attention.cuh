// Causal GQA attention over the f32 KV cache: for token t and head h, softmax(q . K / sqrt(head_dim))
// over positions [0, pos[t]] of sequence seq[t], times V. q: f32 [n_tokens, n_head * head_dim];
// out: f32 [n_tokens, n_head * head_dim]; scores: f32 scratch [n_tokens * n_head,
// AttentionScoresStride(max_ctx)]. One block per (token, head) (and with fused_rope one per KV
// head that prefetches its cells); head_dim <= 1024. Results equal
// the CPU engine's bit for bit (the order of its ggml-style reductions is kept, attention.cu),
// except with split set (below). Multi-token steps may take LaunchFlashAttention instead
// (flash_attention.cuh: the same arguments, on the tensor cores, within 5e-3 relative L2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/qk_norm_rope.cuh"

namespace mer::cuda {

// Floats of scratch per (token, head): the scores, then the softmax's group sums.
inline constexpr int64_t AttentionScoresStride(int64_t max_ctx) { return max_ctx + max_ctx / 16 + 16; }

struct AttentionArgs {
  const float* q;
  const float* k_cache;  // this layer's [max_sequences, max_ctx, kv_dim]
  const float* v_cache;
  const int32_t* seq;
  const int32_t* pos;
  float* scores;
  float* out;
  DevAct out_act;  // when out_act.data is set, the output goes there as activations instead of out
  int n_head, n_head_kv, head_dim, max_ctx;
  bool split = false;  // split-K over the cells (AttentionSplits), for long contexts
  // With fused_rope, q is the raw Q/K/V output and LaunchQkNormRope's work for rope's tokens is
  // done here (decode steps, one token: no block needs another token's new cell): each block
  // norms and rotates its head's q and its KV head's new k itself, takes the new cell's k and v
  // from shared memory, and the first block of each KV head appends them to the cache. Not with
  // split; AttentionFusesQkNormRope says where it can run.
  bool fused_rope = false;
  QkNormRopeArgs rope{};
};

// Split-K (long contexts): each token's cells are cut into equal ranges (at least 32 cells, at
// most kAttentionSplitCells, as many as the scores scratch of a (token, head) holds partials for),
// one block per range and KV head, which takes the query heads of its group (up to 16 at once:
// each K and V row is read once for all of them); the partial softmaxes (max, sum, sum of exp . V) go to the scores
// scratch, and a second kernel combines them. Not bit-exact with the CPU (the scores' and the
// softmax's sums are regrouped; within 1e-5 relative L2 of an exact softmax), so the engine uses
// it only where a step's longest context passes CudaEngineOptions::attention_split_min_cells, and
// the exact kernel (a block per token and head, attention.cu) otherwise.
inline constexpr int kAttentionSplitCells = 256;
// Whether split-K can run at this geometry (head_dim divides the block; its partials fit the scratch).
bool AttentionSplitSupported(int head_dim, int max_ctx);

// Whether the kernel can write its output as activations (out_act): heads of whole Q8_0 blocks.
bool AttentionConvertsOutput(int head_dim);
// Whether the exact kernel can do the Q/K norm, RoPE and KV append (fused_rope): head_dim a power
// of two of at most half the block.
bool AttentionFusesQkNormRope(int head_dim);
void LaunchAttention(const AttentionArgs& args, int n_tokens, cudaStream_t stream);

}  // namespace mer::cuda
