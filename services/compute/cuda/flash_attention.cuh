// Causal GQA attention of multi-token steps on the tensor cores (FlashAttention-2's scheme): the
// same operation as LaunchAttention (attention.cuh) over the same f32 KV cache and arguments, a
// block per kFlashAttentionRows consecutive batch tokens and one query head, q and the K and V
// tiles of kFlashAttentionCells cells staged through shared memory as f16, S = q K^T and O += P V
// by mma.m16n8k16 (f16 in, f32 accumulate), the softmax online in f32 (a running max and sum per row). q: f32 [n_tokens,
// n_head * head_dim]; out: f32 [n_tokens, n_head * head_dim], or activations with out_act
// (any type StoreAct writes); scores, split, fused_rope unused (must be unset).
//
// Each token keeps its own sequence and causal limit (cells [0, pos[t]] of seq[t]); a block whose
// tokens belong to several sequences runs its tiles once per sequence, masking the rows of the
// others, so any batch is computed correctly, and a run of consecutive positions of one sequence
// (a prompt chunk) is the fast case: one pass, and the tiles past a warp's last row skipped.
//
// Numerics: not bit-exact with the CPU engine (the exact kernel, attention.cu, is). q, k, v and
// the probabilities P are rounded to f16 (relative error 2^-11 each; f16 rather than bf16, whose
// 2^-8 is 8x coarser, since q and k are RMS-normed and v is a projection's output: all far inside
// f16's range, which values beyond +-65504 are clamped to), and the sums are regrouped. For scores
// of unit scale that gives about 1e-3 relative L2 against an exact softmax; the tests hold it to
// kFlashAttentionRelL2Bound.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/attention.cuh"

namespace mer::cuda {

// The error bound cuda_kernels_test asserts against the exact kernel (relative L2 over all outputs).
inline constexpr double kFlashAttentionRelL2Bound = 5e-3;
// Tokens per block (query rows of a tile) and KV cells per shared-memory tile.
inline constexpr int kFlashAttentionRows = 64;
inline constexpr int kFlashAttentionCells = 32;

// Whether the tensor-core kernel runs at this head_dim (64 or 128; others take LaunchAttention).
bool FlashAttentionSupported(int head_dim);
void LaunchFlashAttention(const AttentionArgs& args, int n_tokens, cudaStream_t stream);

}  // namespace mer::cuda
