// Per-head RMSNorm of Q and K (weights q_norm/k_norm, f32 [head_dim]), NEOX RoPE with the host's
// cos/sin table (f32 [n_tokens, head_dim / 2], ggml's rope cache), then K and V appended to the
// f32 KV cache of the layer at (seq[t], pos[t]). q: f32 [n_tokens, n_head * head_dim] in place;
// k, v: f32 [n_tokens, kv_dim]; cache row (s, p) at (s * max_ctx + p) * kv_dim. head_dim <= 1024, even.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

struct QkNormRopeArgs {
  float* q;
  const float* k;
  const float* v;
  const float* q_norm;
  const float* k_norm;
  const float* rope_cos;
  const float* rope_sin;
  const int32_t* seq;
  const int32_t* pos;
  float* k_cache;  // this layer's [max_sequences, max_ctx, kv_dim]
  float* v_cache;
  int n_head, n_head_kv, head_dim, max_ctx;
  float eps;
};

void LaunchQkNormRope(const QkNormRopeArgs& args, int n_tokens, cudaStream_t stream);

}  // namespace mer::cuda
