#include "services/compute/cpu/cpu_engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/base/threads.h"
#include "common/quant/quant.h"
#include "services/compute/batch_check.h"
#include "services/compute/cpu/cpu_ops.h"
#include "services/compute/preselected_route.h"
#include "services/compute/sampler.h"

namespace mer {
namespace {

constexpr int64_t kRowsPerChunk = 32;  // weight rows per work item: ~64 KB of Q8_0 at 2048 columns

// Bytes of one activation row of `cols` elements converted for weights of `weight_type`.
int64_t ActivationRowBytes(GgmlType weight_type, int64_t cols) {
  return RowBytes(ActivationTypeFor(weight_type), cols);
}

// out[r] = row r of `rows` . act; F32 weights in ggml_vec_dot_f32's summation order (cpu_ops.h),
// other types by the quant kernels. llama.cpp takes that order for single-token decode and for
// mul_mat_id (the experts); its batched F32 x F32 mat-muls go through llamafile's sgemm instead,
// which mer does not copy, so that a batch stays bit-identical to feeding it token by token.
void RowDots(GgmlType type, const uint8_t* rows, int64_t n_rows, const uint8_t* act, int64_t cols, float* out) {
  if (type != GgmlType::kF32) {
    VecDotRows(type, rows, n_rows, act, cols, out);
    return;
  }
  const float* w = reinterpret_cast<const float*>(rows);
  const float* a = reinterpret_cast<const float*>(act);
  for (int64_t r = 0; r < n_rows; ++r) out[r] = cpu::DotF32Ggml(w + r * cols, a, cols);
}

}  // namespace

CpuEngine::CpuEngine(const ModelWeights& weights, ExpertSource& experts, const CpuEngineOptions& options)
    : weights_(weights),
      experts_(experts),
      config_(weights.config()),
      options_(options),
      pool_(ResolveThreads(options.threads)) {}

CpuEngine::~CpuEngine() = default;

absl::StatusOr<std::unique_ptr<CpuEngine>> CpuEngine::Create(const ModelWeights& weights, ExpertSource& experts,
                                                             const CpuEngineOptions& options) {
  CpuEngineOptions o = options;
  if (o.max_batch_tokens < 1 || o.max_batch_tokens > 65536)
    return absl::InvalidArgumentError("max_batch_tokens must be in [1, 65536]");
  if (o.max_sequences < 1 || o.max_sequences > 4096)
    return absl::InvalidArgumentError("max_sequences must be in [1, 4096]");
  if (o.max_context_tokens < 1) return absl::InvalidArgumentError("max_context_tokens must be >= 1");
  if ((o.placement == nullptr) != (o.exchange == nullptr))
    return absl::InvalidArgumentError("expert parallelism needs both a placement and an exchange");
  const ModelConfig& c = weights.config();
  o.max_context_tokens = std::min(o.max_context_tokens, c.n_ctx_train);
  o.threads = ResolveThreads(o.threads);
  const uint64_t kv_floats = uint64_t(c.n_layer) * o.max_sequences * o.max_context_tokens * c.kv_dim();
  if (kv_floats > (uint64_t{1} << 34))
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache of ", kv_floats * 8, " bytes is too large; lower the context or sequences"));

  std::unique_ptr<CpuEngine> e(new CpuEngine(weights, experts, o));
  const int64_t T = o.max_batch_tokens;
  const int64_t K = c.n_expert_used;
  e->k_cache_.assign(kv_floats, 0.0f);
  e->v_cache_.assign(kv_floats, 0.0f);
  e->seq_len_.assign(o.max_sequences, 0);
  e->x_.resize(T * c.n_embd);
  e->xn_.resize(T * c.n_embd);
  e->q_.resize(T * c.q_dim());
  e->k_.resize(T * c.kv_dim());
  e->v_.resize(T * c.kv_dim());
  e->attn_.resize(T * c.q_dim());
  e->proj_.resize(T * c.n_embd);
  e->scores_.resize(int64_t(o.threads) * o.max_context_tokens);
  e->kqv_lanes_.resize(int64_t(o.threads) * c.head_dim * 64);
  const int64_t widest = std::max({int64_t{c.n_embd}, int64_t{c.q_dim()}, int64_t{c.n_ff_exp}});
  e->act_.resize(T * K * widest * sizeof(float));  // f32 is the widest activation format
  e->act_b_.resize(T * widest * sizeof(float));
  e->act_down_.resize(T * K * c.n_ff_exp * sizeof(float));
  e->router_.resize(T * c.n_expert);
  e->chosen_.resize(T * K);
  e->chosen_w_.resize(T * K);
  e->gate_.resize(T * K * c.n_ff_exp);
  e->up_.resize(T * K * c.n_ff_exp);
  e->expert_out_.resize(T * K * c.n_embd);
  if (o.placement != nullptr) {
    e->pair_runners_.resize(T * K);
    e->rank_load_.resize(o.placement->n_ranks());
  }
  e->rope_cos_.resize(T * c.head_dim / 2);
  e->rope_sin_.resize(T * c.head_dim / 2);
  e->used_experts_.reserve(c.n_expert);
  e->expert_index_.assign(c.n_expert, -1);
  e->group_begin_.resize(c.n_expert + 1);
  e->group_pairs_.resize(T * K);
  e->group_fill_.reserve(c.n_expert);
  e->next_pos_.reserve(o.max_sequences);
  e->seen_.reserve(o.max_sequences);
  e->expert_views_.resize(c.n_expert);
  e->output_rows_.reserve(T);
  return e;
}

int64_t CpuEngine::KvIndex(int layer, int sequence, int position) const {
  return ((int64_t(layer) * options_.max_sequences + sequence) * options_.max_context_tokens + position) *
         config_.kv_dim();
}

void CpuEngine::ClearSequence(int sequence) {
  CHECK(sequence >= 0 && sequence < options_.max_sequences);
  seq_len_[sequence] = 0;
}

absl::Status CpuEngine::Validate(absl::Span<const BatchToken> batch) {
  const BatchLimits limits{options_.max_batch_tokens, config_.n_vocab, options_.max_sequences,
                           options_.max_context_tokens};
  return CheckBatch(batch, limits, seq_len_, &next_pos_, &seen_);
}

const uint8_t* CpuEngine::PrepareActivations(GgmlType weight_type, const float* x, int64_t x_stride, int64_t cols,
                                             int n_tokens, uint8_t* scratch, int64_t* row_bytes) {
  const GgmlType at = ActivationTypeFor(weight_type);
  if (at == GgmlType::kF32) {
    *row_bytes = x_stride * static_cast<int64_t>(sizeof(float));
    return reinterpret_cast<const uint8_t*>(x);
  }
  const int64_t rb = RowBytes(at, cols);
  *row_bytes = rb;
  pool_.ParallelFor(n_tokens, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) QuantizeRow(at, x + t * x_stride, scratch + t * rb, cols);
  });
  return scratch;
}

void CpuEngine::MatMulPrepared(const MatrixView& w, const uint8_t* act, int64_t act_row_bytes, int n_tokens, float* out,
                               int64_t out_stride) {
  pool_.ParallelFor(w.rows, kRowsPerChunk, [&](int64_t r0, int64_t r1) {
    for (int t = 0; t < n_tokens; ++t) {
      RowDots(w.type, reinterpret_cast<const uint8_t*>(w.row(r0)), r1 - r0, act + t * act_row_bytes, w.cols,
              out + t * out_stride + r0);
    }
  });
}

void CpuEngine::MatMul(const MatrixView& w, const float* x, int64_t x_stride, int n_tokens, float* out,
                       int64_t out_stride) {
  int64_t act_row_bytes;
  const uint8_t* act = PrepareActivations(w.type, x, x_stride, w.cols, n_tokens, act_.data(), &act_row_bytes);
  MatMulPrepared(w, act, act_row_bytes, n_tokens, out, out_stride);
}

void CpuEngine::Attention(int layer, absl::Span<const BatchToken> batch) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[layer];
  const int n = static_cast<int>(batch.size());
  const int64_t E = c.n_embd, QD = c.q_dim(), KD = c.kv_dim(), HD = c.head_dim;

  for (int t = 0; t < n; ++t) cpu::RmsNorm(&x_[t * E], L.attn_norm, c.rms_norm_eps, E, &xn_[t * E]);

  // Q, K and V read the same normed input: convert it once when their dot types agree.
  int64_t rb;
  const uint8_t* act = PrepareActivations(L.wq.type, xn_.data(), E, E, n, act_.data(), &rb);
  MatMulPrepared(L.wq, act, rb, n, q_.data(), QD);
  if (ActivationTypeFor(L.wk.type) != ActivationTypeFor(L.wq.type))
    act = PrepareActivations(L.wk.type, xn_.data(), E, E, n, act_.data(), &rb);
  MatMulPrepared(L.wk, act, rb, n, k_.data(), KD);
  if (ActivationTypeFor(L.wv.type) != ActivationTypeFor(L.wk.type))
    act = PrepareActivations(L.wv.type, xn_.data(), E, E, n, act_.data(), &rb);
  MatMulPrepared(L.wv, act, rb, n, v_.data(), KD);

  // Per-head Q/K RMSNorm and RoPE; then K and V go to the cache.
  const int32_t half = c.head_dim / 2;
  for (int t = 0; t < n; ++t) {
    const float* cs = &rope_cos_[t * half];
    const float* sn = &rope_sin_[t * half];
    for (int h = 0; h < c.n_head; ++h) {
      float* q = &q_[t * QD + h * HD];
      cpu::RmsNorm(q, L.q_norm, c.rms_norm_eps, HD, q);
      cpu::RopeNeox(q, c.head_dim, cs, sn);
    }
    for (int h = 0; h < c.n_head_kv; ++h) {
      float* k = &k_[t * KD + h * HD];
      cpu::RmsNorm(k, L.k_norm, c.rms_norm_eps, HD, k);
      cpu::RopeNeox(k, c.head_dim, cs, sn);
    }
    const int64_t kv = KvIndex(layer, batch[t].sequence, batch[t].position);
    std::memcpy(&k_cache_[kv], &k_[t * KD], KD * sizeof(float));
    std::memcpy(&v_cache_[kv], &v_[t * KD], KD * sizeof(float));
  }

  // softmax(q.K / sqrt(head_dim)) V over positions [0, position] of the token's sequence, in
  // ggml's rounding (cpu_ops.h), since an ulp off here can flip a later Q8_0 activation rounding
  // (seen as a 0.05 logit jump at KV length 40 on a qwen3moe Q8_0 model). llama.cpp (no flash
  // attention) computes kq = mul_mat(K, q) with ggml_vec_dot_f32 (q is a permuted view, so never
  // sgemm), soft_max_ext over its padded KV window (a multiple of 256 cells; the masked ones add
  // exact zeros, so n_pos rounded up to 16 gives the same groups of 16), and kqv = mul_mat(V^T, kq)
  // over that window, which for a single token is ggml_vec_dot_f32: output d accumulates cell j in
  // fma lane j % 64. Masked cells have probability 0 and leave the accumulators unchanged. (For
  // batches of >= 2 tokens llama.cpp uses llamafile's sgemm for kqv; mer keeps the decode order so
  // that a batch is bit-identical to feeding it token by token.)
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int group = c.n_head / c.n_head_kv;
  pool_.ParallelForIndexed(int64_t(n) * c.n_head, 1, [&](int64_t i0, int64_t i1, int thread) {
    float* scores = &scores_[int64_t(thread) * options_.max_context_tokens];
    float* acc = &kqv_lanes_[int64_t(thread) * HD * 64];  // 64 accumulator lanes per output
    for (int64_t i = i0; i < i1; ++i) {
      const int t = static_cast<int>(i / c.n_head);
      const int h = static_cast<int>(i % c.n_head);
      const int kvh = h / group;
      const int n_pos = batch[t].position + 1;
      const float* q = &q_[t * QD + h * HD];
      const int64_t base = KvIndex(layer, batch[t].sequence, 0) + kvh * HD;
      for (int j = 0; j < n_pos; ++j) scores[j] = cpu::DotF32Ggml(&k_cache_[base + int64_t(j) * KD], q, HD);
      cpu::Softmax(scores, n_pos, scale, (n_pos + 15) / 16 * 16);
      std::fill(acc, acc + HD * 64, 0.0f);
      for (int j = 0; j < n_pos; ++j) {
        const float* v = &v_cache_[base + int64_t(j) * KD];
        const float p = scores[j];
        float* a = acc + j % 64;
        for (int64_t d = 0; d < HD; ++d) a[d * 64] = std::fma(v[d], p, a[d * 64]);
      }
      float* out = &attn_[t * QD + h * HD];
      for (int64_t d = 0; d < HD; ++d) out[d] = cpu::ReduceAcc64(acc + d * 64);
    }
  });

  MatMul(L.wo, attn_.data(), QD, n, proj_.data(), E);
  for (int64_t i = 0; i < int64_t(n) * E; ++i) x_[i] += proj_[i];
}

absl::Status CpuEngine::MoE(int layer, int n) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[layer];
  const int64_t E = c.n_embd, F = c.n_ff_exp, NE = c.n_expert;
  const int K = c.n_expert_used;

  for (int t = 0; t < n; ++t) cpu::RmsNorm(&x_[t * E], L.ffn_norm, c.rms_norm_eps, E, &xn_[t * E]);

  // Router: softmax over all experts, top-k by probability (ties to the lower id), optionally
  // renormalised over the k chosen (sum in double, clamped as llama.cpp does).
  MatMul(L.router, xn_.data(), E, n, router_.data(), NE);
  bool given_weights = false;
  const bool given = route_override_ != nullptr &&
                     route_override_->Route(layer, n, K, chosen_.data(), chosen_w_.data(), &given_weights);
  if (given)
    RETURN_IF_ERROR(
        CheckPreselectedRoute(layer, n, K, c.n_expert, chosen_.data(), given_weights ? chosen_w_.data() : nullptr));
  for (int t = 0; t < n; ++t) {
    float* p = &router_[t * NE];
    cpu::Softmax(p, NE, 1.0f);
    int32_t* chosen = &chosen_[t * K];
    if (given) {
      // Given weights are used as they are; without them, the router's probabilities of the given
      // experts, renormalised below as the router's own choice is.
      if (given_weights) continue;
      for (int j = 0; j < K; ++j) chosen_w_[t * K + j] = p[chosen[j]];
    } else {
      for (int j = 0; j < K; ++j) {
        int32_t best = -1;
        for (int32_t e = 0; e < NE; ++e) {
          if (std::find(chosen, chosen + j, e) != chosen + j) continue;
          if (best < 0 || p[e] > p[best]) best = e;
        }
        chosen[j] = best;
        chosen_w_[t * K + j] = p[best];
      }
    }
    if (c.norm_topk_prob) {
      double sum = 0.0;
      for (int j = 0; j < K; ++j) sum += chosen_w_[t * K + j];
      const float s = std::max(static_cast<float>(sum), 6.103515625e-5f);
      for (int j = 0; j < K; ++j) chosen_w_[t * K + j] /= s;
    }
  }
  if (routing_observer_ != nullptr) routing_observer_->OnRouting(layer, absl::MakeConstSpan(chosen_.data(), n * K), K);

  // Group the (token, slot) pairs by expert: each expert's weights are read once for all its tokens.
  // A rank of an expert-parallel group takes only the pairs placed on it; the others' outputs are
  // zeros until the exchange below fills them in.
  const ExpertPlacement* placement = options_.placement;
  if (placement != nullptr) {
    placement->AssignRunners(layer, absl::MakeConstSpan(chosen_.data(), n * K),
                             absl::MakeSpan(pair_runners_.data(), n * K), absl::MakeSpan(rank_load_));
    counters_.busiest_rank_pairs += *std::max_element(rank_load_.begin(), rank_load_.end());
  }
  const auto runs_here = [&](int pair) { return placement == nullptr || pair_runners_[pair] == placement->rank(); };
  used_experts_.clear();
  for (int i = 0; i < n * K; ++i) {
    if (!runs_here(i)) {
      std::fill_n(&expert_out_[int64_t(i) * E], E, 0.0f);
      continue;
    }
    const int32_t e = chosen_[i];
    if (expert_index_[e] < 0) {
      expert_index_[e] = 0;
      used_experts_.push_back(e);
    }
  }
  std::sort(used_experts_.begin(), used_experts_.end());
  const int n_used = static_cast<int>(used_experts_.size());
  for (int u = 0; u < n_used; ++u) expert_index_[used_experts_[u]] = u;
  std::fill(group_begin_.begin(), group_begin_.begin() + n_used + 1, 0);
  for (int i = 0; i < n * K; ++i)
    if (runs_here(i)) ++group_begin_[expert_index_[chosen_[i]] + 1];
  for (int u = 0; u < n_used; ++u) group_begin_[u + 1] += group_begin_[u];
  counters_.expert_pairs += group_begin_[n_used];
  {
    std::vector<int32_t>& fill = group_fill_;
    fill.assign(group_begin_.begin(), group_begin_.begin() + n_used);
    for (int i = 0; i < n * K; ++i)
      if (runs_here(i)) group_pairs_[fill[expert_index_[chosen_[i]]]++] = i;
  }
  for (int u = 0; u < n_used; ++u) expert_index_[used_experts_[u]] = -1;

  // The experts are acquired in groups of at most the source's limit (a RAM tier smaller than one
  // layer's experts), each group's SwiGLU computed before the next is acquired. Activations are
  // prepared once, with the first group: every expert of a layer has the same tensor types (known
  // from the views, since a store's dense weights carry no expert tensors).
  const int group_max = std::max(1, experts_.max_experts_per_acquire());
  const uint8_t* act_gate = nullptr;
  const uint8_t* act_up = nullptr;
  int64_t rb_gate = 0, rb_up = 0, rb_down = 0;
  GgmlType down_act_type = GgmlType::kF32;
  const int64_t ff_chunks = (F + kRowsPerChunk - 1) / kRowsPerChunk;
  const int64_t e_chunks = (E + kRowsPerChunk - 1) / kRowsPerChunk;

  for (int u0 = 0; u0 < n_used; u0 += group_max) {
    const int n_group = std::min(group_max, n_used - u0);
    absl::Status status = experts_.AcquireLayer(layer, absl::MakeConstSpan(used_experts_.data() + u0, n_group),
                                                absl::MakeSpan(expert_views_.data() + u0, n_group));
    if (!status.ok()) {
      experts_.ReleaseLayer(layer);
      return status;
    }
    if (u0 == 0) {
      const ExpertWeights& first = expert_views_[0];
      act_gate = PrepareActivations(first.gate.type, xn_.data(), E, E, n, act_.data(), &rb_gate);
      act_up = act_gate;
      rb_up = rb_gate;
      if (ActivationTypeFor(first.up.type) != ActivationTypeFor(first.gate.type))
        act_up = PrepareActivations(first.up.type, xn_.data(), E, E, n, act_b_.data(), &rb_up);
      rb_down = ActivationRowBytes(first.down.type, F);
      down_act_type = ActivationTypeFor(first.down.type);
    }

    // Gate and up projections of the group's experts, over the tokens routed to them.
    pool_.ParallelFor(n_group * ff_chunks, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int u = u0 + static_cast<int>(i / ff_chunks);
        const int64_t r0 = (i % ff_chunks) * kRowsPerChunk;
        const int64_t rows = std::min(kRowsPerChunk, F - r0);
        const ExpertWeights& w = expert_views_[u];
        for (int g = group_begin_[u]; g < group_begin_[u + 1]; ++g) {
          const int pair = group_pairs_[g];
          const int t = pair / K;
          RowDots(w.gate.type, reinterpret_cast<const uint8_t*>(w.gate.row(r0)), rows, act_gate + t * rb_gate, E,
                  &gate_[pair * F + r0]);
          RowDots(w.up.type, reinterpret_cast<const uint8_t*>(w.up.row(r0)), rows, act_up + t * rb_up, E,
                  &up_[pair * F + r0]);
        }
      }
    });

    // SwiGLU, then the result rows converted for the down projection.
    const int g0 = group_begin_[u0], g1 = group_begin_[u0 + n_group];
    pool_.ParallelFor(g1 - g0, 4, [&](int64_t i0, int64_t i1) {
      for (int64_t g = g0 + i0; g < g0 + i1; ++g) {
        const int pair = group_pairs_[g];
        float* h = &gate_[pair * F];
        const float* u = &up_[pair * F];
        cpu::SwiGlu(h, u, F);
        if (down_act_type == GgmlType::kF32) {
          std::memcpy(&act_down_[pair * rb_down], h, F * sizeof(float));
        } else {
          QuantizeRow(down_act_type, h, &act_down_[pair * rb_down], F);
        }
      }
    });

    pool_.ParallelFor(n_group * e_chunks, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int u = u0 + static_cast<int>(i / e_chunks);
        const int64_t r0 = (i % e_chunks) * kRowsPerChunk;
        const int64_t rows = std::min(kRowsPerChunk, E - r0);
        const ExpertWeights& w = expert_views_[u];
        for (int g = group_begin_[u]; g < group_begin_[u + 1]; ++g) {
          const int pair = group_pairs_[g];
          RowDots(w.down.type, reinterpret_cast<const uint8_t*>(w.down.row(r0)), rows, &act_down_[pair * rb_down], F,
                  &expert_out_[pair * E + r0]);
        }
      }
    });
    experts_.ReleaseLayer(layer);
  }

  if (options_.exchange != nullptr) {
    const absl::Time start = absl::Now();
    const absl::Status exchanged = options_.exchange->SumAcrossRanks(expert_out_.data(), size_t(n) * K * E);
    counters_.exchange_seconds_x1e6 += absl::ToInt64Microseconds(absl::Now() - start);
    RETURN_IF_ERROR(exchanged);
  }

  // Weighted sum in top-k order (each product rounded, then added, as ggml's mul + add chain).
  for (int t = 0; t < n; ++t) {
    float* x = &x_[t * E];
    float* acc = &proj_[t * E];
    const float* e0 = &expert_out_[(int64_t(t) * K) * E];
    const float w0 = chosen_w_[t * K];
    for (int64_t i = 0; i < E; ++i) acc[i] = e0[i] * w0;
    for (int j = 1; j < K; ++j) {
      const float* ej = &expert_out_[(int64_t(t) * K + j) * E];
      const float wj = chosen_w_[t * K + j];
      for (int64_t i = 0; i < E; ++i) acc[i] = acc[i] + ej[i] * wj;
    }
    for (int64_t i = 0; i < E; ++i) x[i] = acc[i] + x[i];
  }
  return absl::OkStatus();
}

absl::Status CpuEngine::ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) {
  size_t rows = 0;
  for (const BatchToken& t : batch) rows += t.want_logits;
  const size_t n_vocab = static_cast<size_t>(config_.n_vocab);
  if (argmax_logits_.size() < rows * n_vocab) argmax_logits_.resize(rows * n_vocab);
  RETURN_IF_ERROR(Forward(batch, argmax_logits_.data()));
  for (size_t r = 0; r < rows; ++r)
    ids[r] = Sampler::Argmax(absl::MakeConstSpan(argmax_logits_.data() + r * n_vocab, n_vocab));
  return absl::OkStatus();
}

absl::Status CpuEngine::Forward(absl::Span<const BatchToken> batch, float* logits) {
  RETURN_IF_ERROR(Validate(batch));
  ++counters_.forward_calls;
  counters_.tokens += static_cast<int64_t>(batch.size());
  const ModelConfig& c = config_;
  const int n = static_cast<int>(batch.size());
  const int64_t E = c.n_embd;
  const int32_t half = c.head_dim / 2;

  // Embedding rows, dequantized.
  pool_.ParallelFor(n, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      DequantizeRow(weights_.token_embd.type, weights_.token_embd.row(batch[t].token), &x_[t * E], E);
    }
  });
  for (int t = 0; t < n; ++t)
    cpu::RopeCache(batch[t].position, c.rope_freq_base, c.head_dim, &rope_cos_[t * half], &rope_sin_[t * half]);

  for (int layer = 0; layer < c.n_layer; ++layer) {
    Attention(layer, batch);
    absl::Status status = MoE(layer, n);
    if (!status.ok()) {
      // The other ranks of an expert-parallel group wait for this one's outputs: none can finish.
      if (options_.exchange != nullptr) options_.exchange->Fail(status);
      // The cache holds this batch's K/V for the layers before the failure: forget the batch.
      for (const BatchToken& b : batch) seq_len_[b.sequence] = std::min(seq_len_[b.sequence], b.position);
      return status;
    }
  }
  for (const BatchToken& b : batch) seq_len_[b.sequence] = b.position + 1;

  // Final norm and LM head for the tokens that want logits.
  output_rows_.clear();
  for (int t = 0; t < n; ++t) {
    if (batch[t].want_logits) output_rows_.push_back(t);
  }
  const int n_out = static_cast<int>(output_rows_.size());
  for (int i = 0; i < n_out; ++i)
    cpu::RmsNorm(&x_[output_rows_[i] * E], weights_.output_norm, c.rms_norm_eps, E, &xn_[i * E]);
  if (n_out > 0) MatMul(weights_.output, xn_.data(), E, n_out, logits, c.n_vocab);
  return absl::OkStatus();
}

}  // namespace mer
