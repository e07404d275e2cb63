// The CPU backend of mer-compute: the qwen3moe forward pass, multi-threaded, over batches that may
// mix tokens of several sequences (continuous batching) and several positions of one sequence
// (chunked prompt processing).
//
// Numerics follow llama.cpp's CPU backend on purpose, because parity with it is how correctness
// is judged: activations are rounded to the weight's dot-product type before every matrix product
// (Q8_0 blocks for Q8_0 weights, Q8_K for K-quants, f16/bf16 for f16/bf16), products use integer
// or half dot products, reductions that ggml does in double (RMSNorm, softmax sums) are done in
// double, and the KV cache is f32.
//
// Memory: every buffer is reserved at Create for the worst case (max_batch_tokens tokens, every
// token routed to distinct experts), so Forward allocates nothing.
//
// Thread-safety: one Forward at a time (it owns the workspaces); Create/ClearSequence likewise.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/expert_source.h"
#include "common/model/model_weights.h"
#include "services/compute/backend.h"
#include "services/compute/cpu/thread_pool.h"
#include "services/compute/expert_parallel.h"

namespace mer {

struct CpuEngineOptions {
  int threads = 0;                // worker threads including the caller; 0 = all cores
  int max_batch_tokens = 256;     // tokens per Forward call (prompt chunk size), >= 1
  int max_sequences = 1;          // KV cache slots
  int max_context_tokens = 4096;  // KV positions per sequence; capped at the model's context_length
  // Expert parallelism (expert_parallel.h), both or neither, not owned: this engine is one rank of
  // a group, runs only the (token, expert) pairs `placement` gives it, acquires only their experts,
  // and sums each MoE layer's expert outputs with the other ranks through `exchange`. Every rank
  // must be given the same calls (Forward, ClearSequence) in the same order.
  const ExpertPlacement* placement = nullptr;
  ExpertExchange* exchange = nullptr;
};

class CpuEngine final : public ComputeBackend {
 public:
  static absl::StatusOr<std::unique_ptr<CpuEngine>> Create(const ModelWeights& weights, ExpertSource& experts,
                                                           const CpuEngineOptions& options);
  ~CpuEngine();

  const CpuEngineOptions& options() const { return options_; }

  // ComputeBackend.
  const ModelConfig& config() const override { return config_; }
  int max_batch_tokens() const override { return options_.max_batch_tokens; }
  int max_sequences() const override { return options_.max_sequences; }
  int max_context_tokens() const override { return options_.max_context_tokens; }
  absl::Status Forward(absl::Span<const BatchToken> batch, float* logits) override;
  // Forward into argmax_logits_, then Sampler::Argmax of each row: the logits are on the host anyway.
  absl::Status ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) override;
  void ClearSequence(int sequence) override;
  int32_t sequence_length(int sequence) const override { return seq_len_[sequence]; }
  void set_routing_observer(RoutingObserver* observer) override { routing_observer_ = observer; }
  absl::Status set_route_override(RouteOverride* route) override {
    route_override_ = route;
    return absl::OkStatus();
  }
  // Forward calls and tokens only (no device).
  BackendCounters counters() const override { return counters_; }

 private:
  CpuEngine(const ModelWeights& weights, ExpertSource& experts, const CpuEngineOptions& options);

  absl::Status Validate(absl::Span<const BatchToken> batch);
  void Attention(int layer, absl::Span<const BatchToken> batch);
  absl::Status MoE(int layer, int n_tokens);
  // out[t * out_stride + r] = dot(w row r, x row t) for all t < n_tokens, r < w.rows, with the
  // f32 rows of `x` (stride x_stride floats) first converted to w's activation type.
  void MatMul(const MatrixView& w, const float* x, int64_t x_stride, int n_tokens, float* out, int64_t out_stride);
  // The two halves of MatMul, for inputs shared by several matrices: converts n_tokens rows of x
  // to the activation type of `weight_type` in `scratch` (f32 needs no copy: returns x) and
  // returns them with their row stride in bytes.
  const uint8_t* PrepareActivations(GgmlType weight_type, const float* x, int64_t x_stride, int64_t cols, int n_tokens,
                                    uint8_t* scratch, int64_t* row_bytes);
  void MatMulPrepared(const MatrixView& w, const uint8_t* act, int64_t act_row_bytes, int n_tokens, float* out,
                      int64_t out_stride);

  const ModelWeights& weights_;
  ExpertSource& experts_;
  const ModelConfig config_;
  CpuEngineOptions options_;
  ThreadPool pool_;
  RoutingObserver* routing_observer_ = nullptr;
  RouteOverride* route_override_ = nullptr;
  BackendCounters counters_;

  // KV cache, f32: [layer][sequence][position][kv_dim].
  std::vector<float> k_cache_;
  std::vector<float> v_cache_;
  std::vector<int32_t> seq_len_;   // [max_sequences] positions filled
  std::vector<int32_t> next_pos_;  // Validate's scratch
  std::vector<uint8_t> seen_;
  int64_t KvIndex(int layer, int sequence, int position) const;

  // Workspaces, sized at Create for max_batch_tokens (T) tokens.
  std::vector<float> x_;              // f32 [T, n_embd] residual stream
  std::vector<float> xn_;             // f32 [T, n_embd] normed input of the current sub-layer
  std::vector<float> q_;              // f32 [T, q_dim]
  std::vector<float> k_;              // f32 [T, kv_dim]
  std::vector<float> v_;              // f32 [T, kv_dim]
  std::vector<float> attn_;           // f32 [T, q_dim] attention output, heads concatenated
  std::vector<float> argmax_logits_;  // ForwardArgmax's rows, grown to the most rows asked for
  std::vector<float> scores_;         // f32 [threads, max_context] attention scores per worker
  std::vector<float> kqv_lanes_;      // f32 [threads, head_dim, 64] ggml's fma lanes of softmax . V
  std::vector<float> proj_;           // f32 [T, n_embd] output of a projection before the residual add
  std::vector<uint8_t> act_;          // activations in a weight's dot type, [T * k] rows of the widest
  std::vector<uint8_t> act_b_;        // a second [T] rows, when gate and up want different types
  std::vector<uint8_t> act_down_;     // SwiGLU outputs in the down projection's dot type, [T * k] rows
  std::vector<float> router_;         // f32 [T, n_expert]
  std::vector<int32_t> chosen_;       // [T, k] expert ids
  std::vector<float> chosen_w_;       // [T, k] their weights
  std::vector<float> gate_;           // f32 [T * k, n_ff_exp]
  std::vector<float> up_;             // f32 [T * k, n_ff_exp]
  std::vector<float> expert_out_;     // f32 [T * k, n_embd]
  std::vector<float> rope_cos_;       // [T, head_dim / 2]
  std::vector<float> rope_sin_;
  // Grouping of (token, slot) pairs by expert for the current layer.
  std::vector<int32_t> used_experts_;  // distinct experts of the batch, ascending
  std::vector<int32_t> expert_index_;  // [n_expert] -> index in used_experts_, -1 between layers
  std::vector<int32_t> group_begin_;   // [used + 1] offsets into group_pairs_
  std::vector<int32_t> group_pairs_;   // (t * k + j) sorted by expert
  std::vector<int32_t> group_fill_;    // scratch of the grouping
  std::vector<int32_t> pair_runners_;  // [T * k] the rank that runs each pair (expert parallelism)
  std::vector<int64_t> rank_load_;     // [n_ranks] AssignRunners' scratch
  std::vector<ExpertWeights> expert_views_;
  std::vector<int32_t> output_rows_;  // batch indices that want logits
};

}  // namespace mer
