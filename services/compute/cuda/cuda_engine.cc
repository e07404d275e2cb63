#include "services/compute/cuda/cuda_engine.h"

#include "services/compute/cuda/cuda_engine_impl.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/quant/quant.h"
#include "services/compute/batch_check.h"
#include "services/compute/cpu/cpu_ops.h"
#include "services/compute/cuda/argmax.cuh"
#include "services/compute/cuda/attention.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/device_buffers.h"
#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/embed.cuh"
#include "services/compute/cuda/expert_product.cuh"
#include "services/compute/cuda/matvec.cuh"
#include "services/compute/cuda/miss_post.cuh"
#include "services/compute/cuda/moe_experts.cuh"
#include "services/compute/cuda/moe_group.cuh"
#include "services/compute/cuda/qk_norm_rope.cuh"
#include "services/compute/cuda/quantize.cuh"
#include "services/compute/cuda/rank_layer.cuh"
#include "services/compute/cuda/repack.cuh"
#include "services/compute/cuda/residency_vram.h"
#include "services/compute/cuda/rms_norm.cuh"
#include "services/compute/cuda/router_topk.cuh"
#include "services/compute/cuda/stream_memops.h"
#include "services/compute/cuda/timeline.h"
#include "services/compute/cuda/vram_miss_service.h"
#include "services/compute/preselected_route.h"

namespace mer {

using namespace cuda_engine_internal;  // NOLINT: this library's own internals
using cuda::DevAct;
using cuda::DevMatrix;

namespace {

// A layer's expert types: from the source, or from the weights' merged expert tensors where the
// source cannot tell and the file has them. Gate, up and down may each have any supported type.
absl::StatusOr<ExpertTypes> ExpertTypesOf(const ModelWeights& weights, const ExpertSource& experts, int l) {
  std::optional<ExpertTypes> t = experts.expert_types(l);
  const LayerWeights& L = weights.layers[l];
  if (!t && L.gate_exps.data != nullptr) t = ExpertTypes{L.gate_exps.type, L.up_exps.type, L.down_exps.type};
  if (!t)
    return absl::FailedPreconditionError(
        absl::StrCat("cuda backend: neither the expert source nor the model file gives layer ", l, "'s expert types"));
  for (GgmlType g : {t->gate, t->up, t->down})
    if (!SupportedType(g))
      return absl::UnimplementedError(absl::StrCat("cuda backend: expert tensor type ", TypeName(g),
                                                   " is not supported yet (", kSupportedTypeNames, ")"));
  return *t;
}

// Whether stream memory operations (cuStreamWaitValue32/WriteValue32) run on this device: one
// write and one wait on a scratch word, synchronised.
bool StreamMemOpsWork(cudaStream_t stream) {
  uint32_t* word = nullptr;
  if (cudaMalloc(&word, 4) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool ok = cuda::StreamMemOpsAvailable() && cuda::StreamWrite(stream, word, 7) &&
                  cuda::StreamWaitEqual(stream, word, 7) && cudaStreamSynchronize(stream) == cudaSuccess;
  if (!ok) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "cuda: stream memory operations do not work here: misses are served by the host\n");
  }
  CUDA_CHECK(cudaFree(word));
  return ok;
}

// Whether a graph captures stream memory operations (then the device path's steps, with a gate
// wait per layer, replay as graphs): a captured write and wait on a scratch word, replayed.
bool GraphsTakeStreamMemOps(cudaStream_t stream) {
  uint32_t* word = nullptr;
  CUDA_CHECK(cudaMalloc(&word, 4));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool ok = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (ok) {
    const bool ops = cuda::StreamWrite(stream, word, 5) && cuda::StreamWaitEqual(stream, word, 5);
    ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ops;
  }
  ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && cudaGraphLaunch(exec, stream) == cudaSuccess &&
       cudaStreamSynchronize(stream) == cudaSuccess;
  if (!ok) {
    (void)cudaGetLastError();
    std::fprintf(stderr,
                 "cuda: graphs do not capture stream memory operations here: device-path steps run uncaptured\n");
  }
  if (exec != nullptr) CUDA_CHECK(cudaGraphExecDestroy(exec));
  if (graph != nullptr) CUDA_CHECK(cudaGraphDestroy(graph));
  CUDA_CHECK(cudaFree(word));
  return ok;
}

// The expert-parallel options (CudaEngineOptions::placement and its exchange) that the engine
// runs; the others refused, naming the limit.
absl::Status CheckRankOptions(const ModelConfig& c, const CudaEngineOptions& o) {
  if (o.placement == nullptr) {
    if (o.device_exchange != nullptr || o.host_exchange != nullptr)
      return absl::InvalidArgumentError("cuda backend: an expert exchange without a placement (ranks need both)");
    return absl::OkStatus();
  }
  const ExpertPlacement& p = *o.placement;
  if ((o.device_exchange == nullptr) == (o.host_exchange == nullptr))
    return absl::InvalidArgumentError(
        "cuda expert ranks: a placement needs exactly one exchange, the device's (NCCL) or the host's");
  if (p.n_ranks() > cuda::kRankLayerMaxRanks)
    return absl::InvalidArgumentError(
        absl::StrCat("cuda expert ranks: ", p.n_ranks(), " ranks, at most ", cuda::kRankLayerMaxRanks));
  if (p.OwnedExperts(c.n_expert) == 0)
    return absl::InvalidArgumentError(absl::StrCat("cuda expert ranks: rank ", p.rank(), " of ", p.n_ranks(),
                                                   " holds none of the model's ", c.n_expert,
                                                   " experts (at most as many ranks as experts)"));
  if (p.replicas() > 0)
    return absl::UnimplementedError(
        "cuda expert ranks: replicated experts (--replicate-hot-experts) are not built: a rank's arena holds its "
        "share only");
  if (o.vram_residency != nullptr)
    return absl::UnimplementedError(
        "cuda expert ranks: an arena placed by mer-residency (vram_residency, device_misses) is not built: each "
        "rank preloads its share into an arena of its own");
  return absl::OkStatus();
}

// MER_CUDA_DEBUG=1 logs the stages of Create to stderr (start-up problems on a new machine).
void DebugLog(const char* stage) {
  static const bool on = std::getenv("MER_CUDA_DEBUG") != nullptr;
  if (on) std::fprintf(stderr, "cuda: %s\n", stage);
}

// Matrices that read the same input rows (Q, K, V), each in its weight's activation type
// (acts[i]), in one launch per run of equal types (LaunchMatvec takes one type; Q4_K_M files give
// V another type than Q and K, and with 8 experts K and V are Q8_0 beside a K-quant Q).
void LaunchMatvecRuns(const cuda::MatvecOutput* outputs, int n, const DevAct* const* acts, int n_tokens,
                      cudaStream_t stream) {
  for (int i = 0; i < n;) {
    int j = i + 1;
    while (j < n && outputs[j].w.type == outputs[i].w.type) ++j;
    cuda::LaunchMatvec(outputs + i, j - i, *acts[i], n_tokens, stream);
    i = j;
  }
}

// A MoeGroups' arrays (counts, used experts, group starts, pairs) as one table entry, and its
// lookup counter as another.
void AddMoeGroups(cuda::DeviceBufferTable& table, int64_t n_expert, int64_t n_pairs, cuda::MoeGroups* g,
                  const char* what) {
  table.AddEntry(8 + (n_expert + 1) * 4 * 2 + n_pairs * 4, what, [g, n_expert](uint8_t* p) {
    g->n_used = reinterpret_cast<int32_t*>(p);
    g->n_missing = g->n_used + 1;
    g->used = g->n_used + 2;
    g->begin = g->used + n_expert + 1;
    g->pairs = g->begin + n_expert + 1;
  });
  table.Add(&g->lookups_total, 8, what);
}

}  // namespace

CudaEngine::Impl::~Impl() {
  CUDA_CHECK(cudaSetDevice(o.device));  // the thread that destroys the engine may have another current
  if (stream != nullptr) CUDA_CHECK(cudaStreamSynchronize(stream));
  cuda::TimelineWrite();
  miss_service.reset();    // stops its thread, unpins what it published
  residency_vram.reset();  // unpins (nothing reads the arena now), before the arena goes
  for (cudaEvent_t e : event_pool) CUDA_CHECK(cudaEventDestroy(e));
  for (auto* graphs : {&graph, &pipe_graph})
    for (auto& by_rows : *graphs)
      for (auto& by_split : by_rows)
        for (cudaGraphExec_t& g : by_split)
          if (g != nullptr) CUDA_CHECK(cudaGraphExecDestroy(g));
  for (cudaEvent_t e : pipe_done)
    if (e != nullptr) CUDA_CHECK(cudaEventDestroy(e));
  if (step_done != nullptr) CUDA_CHECK(cudaEventDestroy(step_done));
  if (copy_stream != nullptr) CUDA_CHECK(cudaStreamSynchronize(copy_stream));
  if (pinned_base != nullptr) CUDA_CHECK(cudaHostUnregister(pinned_base));
  if (record_ring != nullptr) CUDA_CHECK(cudaFreeHost(record_ring));
  for (void* p :
       {static_cast<void*>(host_input), static_cast<void*>(pipe_input[0]), static_cast<void*>(pipe_input[1]),
        static_cast<void*>(pipe_ids), static_cast<void*>(host_slot_table), static_cast<void*>(host_groups),
        static_cast<void*>(host_chosen), static_cast<void*>(host_lookups), static_cast<void*>(host_table_upload),
        static_cast<void*>(host_pred), static_cast<void*>(route_ids), static_cast<void*>(route_weights),
        static_cast<void*>(host_rank_counts), static_cast<void*>(host_expert_out)})
    if (p != nullptr) CUDA_CHECK(cudaFreeHost(p));
  dense_pool.Free();
  work_pool.Free();
  arena_pool.Free();
  if (prefetch_done != nullptr) CUDA_CHECK(cudaEventDestroy(prefetch_done));
  if (copy_stream != nullptr) CUDA_CHECK(cudaStreamDestroy(copy_stream));
  if (stream != nullptr) CUDA_CHECK(cudaStreamDestroy(stream));
}

int CudaEngine::DeviceCount() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool CudaEngine::DeviceAvailable() { return DeviceCount() > 0; }

CudaEngine::CudaEngine(const ModelConfig& config, const CudaEngineOptions& options, std::unique_ptr<Impl> impl)
    : config_(config), options_(options), impl_(std::move(impl)) {}

CudaEngine::~CudaEngine() = default;

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const ModelWeights& weights, ExpertSource& experts,
                                                               const CudaEngineOptions& options) {
  CudaEngineOptions o = options;
  const ModelConfig& c = weights.config();
  if (o.max_batch_tokens < 1 || o.max_batch_tokens > 4096)
    return absl::InvalidArgumentError("max_batch_tokens must be in [1, 4096] for the cuda backend");
  if (o.max_sequences < 1 || o.max_sequences > 4096)
    return absl::InvalidArgumentError("max_sequences must be in [1, 4096]");
  if (o.max_context_tokens < 1) return absl::InvalidArgumentError("max_context_tokens must be >= 1");
  if (o.staging_experts < 1 || o.staging_experts > cuda::kMaxRepackJobs / 3)
    return absl::InvalidArgumentError("staging_experts must be in [1, 16]");
  o.max_context_tokens = std::min(o.max_context_tokens, c.n_ctx_train);
  if (!DeviceAvailable()) return absl::FailedPreconditionError("no CUDA device is available");
  if (o.device < 0 || o.device >= DeviceCount())
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: GPU ", o.device, " of the ", DeviceCount(), " this process sees"));
  RETURN_IF_ERROR(CheckRankOptions(c, o));
  cuda::TimelineStart();

  // Sizes the kernels support (each kernel's header states them).
  if (c.n_embd % 32 != 0 || c.q_dim() % 32 != 0 || c.n_ff_exp % 32 != 0 || c.kv_dim() % 2 != 0)
    return absl::UnimplementedError("cuda backend: n_embd, q_dim and n_ff_exp must be multiples of 32");
  if (c.head_dim > 1024 || c.head_dim % 2 != 0 || c.n_head % c.n_head_kv != 0)
    return absl::UnimplementedError("cuda backend: head_dim must be even and <= 1024, n_head a multiple of n_head_kv");
  if (c.n_embd > 8192) return absl::UnimplementedError("cuda backend: n_embd must be <= 8192 (rms_norm.cuh)");
  if (c.n_expert > 1024 || c.n_expert_used > 32)
    return absl::UnimplementedError("cuda backend: at most 1024 experts and top-32");
  auto impl = std::make_unique<Impl>(weights, experts);
  Impl& m = *impl;
  m.o = o;
  CUDA_CHECK(cudaSetDevice(o.device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&m.copy_stream, cudaStreamNonBlocking));
  CUDA_CHECK(cudaEventCreateWithFlags(&m.prefetch_done, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventCreateWithFlags(&m.step_done, cudaEventDisableTiming));

  // Types. The experts' come from the source (the file's tensors, or an expert store's manifest
  // when the weights are a store's dense.gguf), else from the weights' expert tensors; per layer
  // they may differ (Q4_K_M), and gate, up and down may each have its own. Q, K and V may read
  // their input in two activation types (EnqueueLayer converts it into two buffers), as every GGUF
  // mix does; so may gate and up (act_up).
  for (const LayerWeights& L : weights.layers) {
    for (const MatrixView* mv : {&L.wq, &L.wk, &L.wv, &L.wo, &L.router})
      if (!SupportedType(mv->type))
        return absl::UnimplementedError(absl::StrCat("cuda backend: tensor type ", TypeName(mv->type),
                                                     " is not supported yet (", kSupportedTypeNames, ")"));
    const GgmlType aq = ActivationTypeFor(L.wq.type), ak = ActivationTypeFor(L.wk.type),
                   av = ActivationTypeFor(L.wv.type);
    if (aq != ak && aq != av && ak != av)
      return absl::UnimplementedError("cuda backend: Q, K and V read three activation types (at most two)");
  }
  if (!SupportedType(weights.output.type) || !SupportedType(weights.token_embd.type))
    return absl::UnimplementedError("cuda backend: unsupported type of token_embd or output");
  int64_t slot_end = 0;
  bool up_acts = false;  // whether some layer's up reads another activation type than its gate
  for (int l = 0; l < c.n_layer; ++l) {
    ASSIGN_OR_RETURN(const ExpertTypes t, ExpertTypesOf(weights, experts, l));
    const cuda::ExpertLayout el = cuda::ExpertLayoutFor(t.gate, t.up, t.down, c.n_embd, c.n_ff_exp);
    slot_end = std::max(slot_end, el.end());
    up_acts = up_acts || ActType(t.up) != ActType(t.gate);
    // Over CUDA IPC a slot first receives the blob's bytes, converted in place (residency_vram.h).
    if (o.vram_residency != nullptr) slot_end = std::max<int64_t>(slot_end, o.vram_residency->raw_offsets(l).bytes);
    m.expert_layout.push_back(el);
  }
  m.slot_bytes = AlignUp(slot_end);
  m.total_experts = int64_t(c.n_layer) * c.n_expert;
  m.held_experts =
      o.placement != nullptr ? int64_t(c.n_layer) * o.placement->OwnedExperts(c.n_expert) : m.total_experts;

  // Dense weights: one table entry per tensor, then the upload of each (matrices whose device
  // layout differs go through a staging buffer and the repack kernel).
  struct DenseTensor {
    const void* src;
    int64_t bytes;
    const MatrixView* matrix;  // repacked when its type needs it; null: copied as is
    uint8_t* dst;              // set by the table's Bind
  };
  std::vector<DenseTensor> dense_tensors;
  dense_tensors.reserve(3 + 9 * weights.layers.size());  // addresses stay put for the binds
  cuda::DeviceBufferTable dense;
  int64_t largest = 0;
  auto add_dense = [&](const void* src, int64_t bytes, const MatrixView* matrix, const char* what, auto** field) {
    dense_tensors.push_back({src, bytes, matrix, nullptr});
    DenseTensor* t = &dense_tensors.back();
    dense.AddEntry(bytes, what, [t, field](uint8_t* p) {
      t->dst = p;
      *field = reinterpret_cast<std::remove_pointer_t<decltype(field)>>(p);
    });
    if (matrix != nullptr) largest = std::max(largest, bytes);
  };
  auto add_matrix = [&](const MatrixView& mv, const char* what, DevMatrix* dm) {
    *dm = DevMatrix{DevTypeOf(mv.type), mv.rows, mv.cols, nullptr};
    add_dense(mv.data, MatrixBytes(mv), &mv, what, &dm->data);
  };
  m.embd_type = DevTypeOf(weights.token_embd.type);
  m.embd_row_bytes = weights.token_embd.row_bytes();
  add_dense(weights.token_embd.data, MatrixBytes(weights.token_embd), nullptr, "token_embd", &m.embd);
  add_matrix(weights.output, "output", &m.output);
  m.output_type = weights.output.type;
  add_dense(weights.output_norm, int64_t(c.n_embd) * 4, nullptr, "output_norm", &m.output_norm);
  m.layers.resize(weights.layers.size());
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& L = weights.layers[l];
    DevLayer& d = m.layers[l];
    add_dense(L.attn_norm, int64_t(c.n_embd) * 4, nullptr, "attn_norm", &d.attn_norm);
    add_dense(L.ffn_norm, int64_t(c.n_embd) * 4, nullptr, "ffn_norm", &d.ffn_norm);
    add_dense(L.q_norm, int64_t(c.head_dim) * 4, nullptr, "q_norm", &d.q_norm);
    add_dense(L.k_norm, int64_t(c.head_dim) * 4, nullptr, "k_norm", &d.k_norm);
    add_matrix(L.wq, "wq", &d.wq);
    add_matrix(L.wk, "wk", &d.wk);
    add_matrix(L.wv, "wv", &d.wv);
    add_matrix(L.wo, "wo", &d.wo);
    add_matrix(L.router, "router", &d.router);
    d.wq_type = L.wq.type;
    d.wk_type = L.wk.type;
    d.wv_type = L.wv.type;
    d.wo_type = L.wo.type;
    d.router_type = L.router.type;
  }
  RETURN_IF_ERROR(m.dense_pool.Allocate(dense, "dense weights"));
  uint8_t* dense_staging = nullptr;
  if (largest > 0) {
    const cudaError_t e = cudaMalloc(&dense_staging, largest);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError("cudaMalloc of the dense-weight staging buffer failed");
    }
  }
  for (const DenseTensor& t : dense_tensors) {
    if (t.matrix == nullptr || !NeedsRepack(t.matrix->type)) {
      CUDA_CHECK(cudaMemcpyAsync(t.dst, t.src, t.bytes, cudaMemcpyHostToDevice, m.stream));
      continue;
    }
    CUDA_CHECK(cudaMemcpyAsync(dense_staging, t.src, t.bytes, cudaMemcpyHostToDevice, m.stream));
    const cuda::RepackJob job{dense_staging, t.dst, t.bytes, t.matrix->cols};
    cuda::LaunchRepack(DevTypeOf(t.matrix->type), &job, 1, m.stream);
    CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the staging buffer is reused by the next one
  }
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  CUDA_CHECK(cudaFree(dense_staging));
  DebugLog("dense weights uploaded");
  m.stats.dense_bytes = m.dense_pool.size();

  // KV cache and workspaces.
  const int64_t T = o.max_batch_tokens, K = c.n_expert_used, E = c.n_embd, QD = c.q_dim(), KD = c.kv_dim(),
                F = c.n_ff_exp, NE = c.n_expert, V = c.n_vocab;
  const int64_t kv_bytes = int64_t(c.n_layer) * o.max_sequences * o.max_context_tokens * KD * 4;
  const int64_t act_a_elems = T * std::max(E, QD);
  const int64_t act_b_elems = std::max(T * K * F, T * E);
  const int64_t half = c.head_dim / 2;
  m.in.tokens = 0;
  m.in.pos = m.in.tokens + AlignUp(T * 4);
  m.in.seq = m.in.pos + AlignUp(T * 4);
  m.in.out_rows = m.in.seq + AlignUp(T * 4);
  m.in.rope_cos = m.in.out_rows + AlignUp(T * 4);
  m.in.rope_sin = m.in.rope_cos + AlignUp(T * half * 4);
  m.in.step = m.in.rope_sin + AlignUp(T * half * 4);
  m.in.bytes = m.in.step + AlignUp(4);
  // Workspaces: one table entry per buffer (f32 unless the name says otherwise).
  cuda::DeviceBufferTable w;
  const int64_t scores_elems = T * c.n_head * cuda::AttentionScoresStride(o.max_context_tokens);
  w.Add(&m.x, T * E * 4, "x");
  w.Add(&m.xn, T * E * 4, "xn");
  w.Add(&m.q, T * QD * 4, "q");
  w.Add(&m.k, T * KD * 4, "k");
  w.Add(&m.v, T * KD * 4, "v");
  w.Add(&m.attn, T * QD * 4, "attn");
  w.Add(&m.scores, scores_elems * 4, "scores");
  w.Add(&m.router_logits, T * NE * 4, "router_logits");
  w.Add(&m.chosen_w, T * K * 4, "chosen_w");
  w.Add(&m.h, T * K * F * 4, "h");
  w.Add(&m.expert_out, T * K * E * 4, "expert_out");
  w.Add(&m.logits, T * V * 4, "logits");
  w.Add(&m.chosen, T * K * 4, "chosen");
  w.Add(&m.argmax_ids, T * 4, "argmax_ids");
  w.Add(&m.argmax_scratch, cuda::ArgmaxScratchBytes(T), "argmax_scratch");
  w.Add(&m.act_a, act_a_elems * 4, "act_a");
  w.Add(&m.act_a_scales, act_a_elems / 32 * 4, "act_a_scales");
  w.Add(&m.act_b, act_b_elems * 4, "act_b");
  w.Add(&m.act_b_scales, act_b_elems / 32 * 4, "act_b_scales");
  if (up_acts) {  // as act_a: room for f32 rows, the widest activation type
    w.Add(&m.act_up, T * E * 4, "act_up");
    w.Add(&m.act_up_scales, T * E / 32 * 4, "act_up_scales");
  }
  AddMoeGroups(w, NE, T * K, &m.groups, "groups");
  w.Add(&m.router_blocks_done, 4, "router_blocks_done");
  w.Add(&m.step_input, m.in.bytes, "step_input");
  w.Add(&m.staging, int64_t(o.staging_experts) * m.slot_bytes, "staging");
  w.Add(&m.prefetch_staging, int64_t(o.staging_experts) * m.slot_bytes, "prefetch_staging");
  w.Add(&m.pred_logits, NE * 4, "pred_logits");
  w.Add(&m.pred_chosen, K * 4, "pred_chosen");
  w.Add(&m.pred_w, K * 4, "pred_w");
  AddMoeGroups(w, NE, K, &m.pred_groups, "pred_groups");
  w.Add(&m.slot_table, m.total_experts * 4, "slot_table");
  w.Add(&m.gates, int64_t(c.n_layer) * 4, "gates");
  w.Add(&m.record_head, 8, "record_head");
  w.Add(&m.rank_counts, sizeof(cuda::RankCounts), "rank_counts");
  if (o.placement != nullptr) w.Add(&m.held, m.total_experts, "held");
  RETURN_IF_ERROR(m.work_pool.Allocate(w, "workspaces"));
  m.lookups_total = m.groups.lookups_total;
  // Rows of pairs a pass has not computed yet are quantized too: keep them finite.
  CUDA_CHECK(cudaMemsetAsync(m.h, 0, T * K * F * 4, m.stream));
  CUDA_CHECK(cudaMemsetAsync(m.lookups_total, 0, 8, m.stream));
  CUDA_CHECK(cudaMemsetAsync(m.pred_groups.lookups_total, 0, 8, m.stream));
  CUDA_CHECK(cudaMemsetAsync(m.router_blocks_done, 0, 4, m.stream));
  CUDA_CHECK(cudaMemsetAsync(m.gates, 0, int64_t(c.n_layer) * 4, m.stream));
  CUDA_CHECK(cudaMemsetAsync(m.record_head, 0, 8, m.stream));
  CUDA_CHECK(cudaMemsetAsync(m.rank_counts, 0, sizeof(cuda::RankCounts), m.stream));
  if (o.placement != nullptr) {
    std::vector<uint8_t> held(m.total_experts);
    for (int l = 0; l < c.n_layer; ++l)
      for (int e = 0; e < c.n_expert; ++e) held[int64_t(l) * c.n_expert + e] = o.placement->Holds(l, e);
    CUDA_CHECK(cudaMemcpy(m.held, held.data(), m.total_experts, cudaMemcpyHostToDevice));
  }
  CUDA_CHECK(cudaMemsetAsync(m.argmax_scratch, 0, cuda::ArgmaxScratchBytes(T), m.stream));
  m.stats.workspace_bytes = w.bytes();
  {
    const cudaError_t e1 = cudaMalloc(&m.k_cache, kv_bytes);
    const cudaError_t e2 = e1 == cudaSuccess ? cudaMalloc(&m.v_cache, kv_bytes) : e1;
    if (e2 != cudaSuccess) {
      (void)cudaGetLastError();
      if (m.k_cache != nullptr) CUDA_CHECK(cudaFree(m.k_cache));
      m.k_cache = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache of ", 2 * kv_bytes, " bytes does not fit; lower --ctx or sequences"));
    }
    m.stats.kv_bytes = 2 * kv_bytes;
  }

  DebugLog("workspaces and KV cache allocated");
  CUDA_CHECK(cudaMallocHost(&m.host_input, m.in.bytes));
  for (int b = 0; b < 2; ++b) {
    CUDA_CHECK(cudaMallocHost(&m.pipe_input[b], m.in.bytes));
    CUDA_CHECK(cudaEventCreateWithFlags(&m.pipe_done[b], cudaEventDisableTiming));
  }
  CUDA_CHECK(cudaMallocHost(&m.pipe_ids, 2 * 4));
  CUDA_CHECK(cudaMallocHost(&m.host_slot_table, m.total_experts * 4));
  CUDA_CHECK(cudaMallocHost(&m.host_groups, (NE + 2) * 4));
  CUDA_CHECK(cudaMallocHost(&m.host_chosen, T * K * 4));
  CUDA_CHECK(cudaMallocHost(&m.host_lookups, 8));
  CUDA_CHECK(cudaMallocHost(&m.host_table_upload, m.total_experts * 4));
  CUDA_CHECK(cudaMallocHost(&m.host_pred, K * 4));
  *m.host_lookups = 0;
  if (o.placement != nullptr) {
    CUDA_CHECK(cudaMallocHost(&m.host_rank_counts, sizeof(cuda::RankCounts)));
    *m.host_rank_counts = cuda::RankCounts{};
  }
  if (o.host_exchange != nullptr) CUDA_CHECK(cudaMallocHost(&m.host_expert_out, T * K * E * 4));

  // The arena: what is left after everything above, less the margin, under the caps.
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  int64_t arena_max = static_cast<int64_t>(free_b) - o.vram_margin_bytes;
  if (o.vram_expert_budget_bytes >= 0) arena_max = std::min(arena_max, o.vram_expert_budget_bytes);
  int64_t slots = std::max<int64_t>(0, arena_max / m.slot_bytes);
  // The fraction is of the experts this engine runs: all of them, or an expert-parallel rank's share.
  if (o.vram_expert_budget_fraction > 0)
    slots = std::min<int64_t>(slots, static_cast<int64_t>(o.vram_expert_budget_fraction * m.held_experts + 0.5));
  slots = std::min(slots, m.held_experts);
  if (o.placement != nullptr && slots < m.held_experts)
    return absl::UnimplementedError(
        absl::StrCat("cuda expert ranks need each rank's share of the experts in its arena: rank ", o.placement->rank(),
                     " of ", o.placement->n_ranks(), " holds ", m.held_experts, " experts (", c.n_layer, " layers x ",
                     o.placement->OwnedExperts(c.n_expert), ", ",
                     absl::StrFormat("%.2f", m.held_experts * m.slot_bytes / 1073741824.0), " GiB), its arena ", slots,
                     " (the VRAM budget, or the free VRAM less the margin); misses on ranks are not built"));
  // An arena that holds every expert needs no placement: compute fills it once, below, through the
  // expert source (mer-residency's RAM tier when served) and then runs every step on the device
  // path, with no residency round trip and nothing for mer-residency to evict. Only an arena of a
  // part of the experts is exported to mer-residency, which then places them.
  if (slots == m.held_experts) o.vram_residency = nullptr;
  m.o.vram_residency = o.vram_residency;
  if (o.vram_residency != nullptr) slots = std::min<int64_t>(slots, o.vram_residency->max_vram_slots());
  if (slots < 1)
    return absl::ResourceExhaustedError(
        absl::StrCat("no VRAM left for the expert arena (", free_b, " bytes free, margin ", o.vram_margin_bytes, ")"));
  m.n_slots = static_cast<int32_t>(slots);
  // The device decides hits and misses when mer-residency places the experts and a layer's every
  // expert fits beside the reserve (else the host serves each layer's misses: ServeFromResidency).
  const int reserve_slots = 2 * c.n_expert_used;
  m.device_misses = o.vram_residency != nullptr && o.device_misses && slots >= c.n_expert + reserve_slots &&
                    StreamMemOpsWork(m.stream);
  if (m.device_misses && cuda::KernelsLoadLazily()) {
    // A step waits at a gate while later launches load their kernels: stream_memops.h says why
    // that never ends. mer-compute sets CUDA_MODULE_LOADING=EAGER for --miss-path device.
    std::fprintf(stderr,
                 "cuda: misses stay on the host path: kernels load lazily in this process (set "
                 "CUDA_MODULE_LOADING=EAGER before the first CUDA call)\n");
    m.device_misses = false;
  }
  m.device_graphs = m.device_misses && GraphsTakeStreamMemOps(m.stream);
  cuda::DeviceBufferTable arena_table;
  // One slot more on the device path, never exported: the poison slot (zeros) that a failed
  // placement points its experts at (vram_miss_service.h).
  arena_table.Add(&m.arena, (slots + (m.device_misses ? 1 : 0)) * m.slot_bytes, "arena");
  RETURN_IF_ERROR(m.arena_pool.Allocate(arena_table, "the expert arena"));
  if (m.device_misses) CUDA_CHECK(cudaMemsetAsync(m.arena + slots * m.slot_bytes, 0, m.slot_bytes, m.stream));
  m.stats.arena_bytes = slots * m.slot_bytes;
  m.stats.arena_slots = slots;
  m.stats.arena_placed_by_residency = o.vram_residency != nullptr;
  m.stats.slot_bytes = m.slot_bytes;
  m.stats.total_experts = m.held_experts;
  m.owner.assign(slots, -1);
  m.pin_epoch.assign(slots, 0);
  m.lru_nodes.resize(slots);
  for (int32_t s = 0; s < m.n_slots; ++s) m.lru.PushFront(m.lru_nodes, s);  // slot 0 the least recent
  if (o.vram_residency != nullptr) {
    std::vector<cuda::VramLayerLayout> layouts;
    for (int l = 0; l < c.n_layer; ++l) {
      layouts.push_back(cuda::VramLayerLayout{m.expert_layout[l], o.vram_residency->raw_offsets(l)});
    }
    ASSIGN_OR_RETURN(m.residency_vram,
                     cuda::ResidencyVram::Create(*o.vram_residency, o.device, m.arena, m.slot_bytes, m.n_slots,
                                                 std::move(layouts), m.staging, o.staging_experts));
  }
  if (m.device_misses) {
    m.ring_capacity = 4 * c.n_layer;
    m.record_bytes = cuda::RoutingRecordBytes(c.n_expert, c.n_expert_used);
    const int64_t ring_bytes = int64_t(m.ring_capacity) * m.record_bytes;
    CUDA_CHECK(cudaHostAlloc(&m.record_ring, ring_bytes, cudaHostAllocMapped));
    std::memset(m.record_ring, 0, ring_bytes);
    CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&m.record_ring_device), m.record_ring, 0));
    cuda::VramMissServiceOptions so;
    so.n_layer = c.n_layer;
    so.n_expert = c.n_expert;
    so.k = c.n_expert_used;
    so.n_slots = m.n_slots;
    so.poison_slot = m.n_slots;
    so.reserve_slots = reserve_slots;
    so.device = o.device;
    so.debug = std::getenv("MER_CUDA_DEBUG") != nullptr;
    so.policy = o.arena_policy;
    ASSIGN_OR_RETURN(m.miss_service,
                     cuda::VramMissService::Create(*m.residency_vram, so, m.record_ring, m.ring_capacity,
                                                   m.record_bytes, m.slot_table, m.gates));
    std::fprintf(stderr, "cuda: misses decided on the device (%d slots, %d reserved for placements; %s)\n", m.n_slots,
                 reserve_slots, o.arena_policy == cuda::ArenaPolicy::kLfu ? "lfu" : "lru");
  }
  std::fill(m.host_slot_table, m.host_slot_table + m.total_experts, -1);
  CUDA_CHECK(cudaMemcpyAsync(m.slot_table, m.host_slot_table, m.total_experts * 4, cudaMemcpyHostToDevice, m.stream));
  CUDA_CHECK(cudaStreamSynchronize(m.stream));

  // Pin the experts' host memory when it is the mapped model file, so misses upload by DMA at full
  // PCIe speed instead of through the driver's pageable staging. Experts from elsewhere (an expert
  // store's dense.gguf has no expert tensors) are pinned by their source: mer-residency's RAM tier
  // through ResidencyExpertSourceOptions::pin_ram_tier (backend_factory.h, HostMemoryPinnerFor).
  if (o.pin_host_experts && weights.layers[0].gate_exps.data != nullptr) {
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (const LayerWeights& L : weights.layers)
      for (const MatrixView* mv : {&L.gate_exps, &L.up_exps, &L.down_exps}) {
        lo = std::min(lo, reinterpret_cast<uintptr_t>(mv->data));
        hi = std::max(hi, reinterpret_cast<uintptr_t>(mv->data) + MatrixBytes(*mv));
      }
    const uintptr_t page = 4096;
    lo &= ~(page - 1);
    hi = (hi + page - 1) & ~(page - 1);
    DebugLog("registering the experts' host memory");
    const auto t0 = std::chrono::steady_clock::now();
    const cudaError_t e =
        cudaHostRegister(reinterpret_cast<void*>(lo), hi - lo, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (e == cudaSuccess) {
      m.pinned_base = reinterpret_cast<void*>(lo);
      m.stats.host_experts_pinned = true;
      std::fprintf(stderr, "cuda: pinned %.2f GiB of expert host memory in %.2f s\n", (hi - lo) / 1073741824.0, secs);
    } else {
      (void)cudaGetLastError();
      std::fprintf(stderr, "cuda: cudaHostRegister of the experts failed (%s); uploads are pageable\n",
                   cudaGetErrorString(e));
    }
  }

  m.missing.reserve(NE);
  m.views.reserve(NE);
  m.jobs.reserve(cuda::kMaxRepackJobs);
  m.pending_release.reserve(1);
  m.seq_len.assign(o.max_sequences, 0);
  m.next_pos.reserve(o.max_sequences);
  m.seen.reserve(o.max_sequences);
  m.out_rows.reserve(T);
  m.SampleVram();

  std::unique_ptr<CudaEngine> engine(new CudaEngine(c, o, std::move(impl)));
  const double gib = 1073741824.0;
  engine->budget_report_ = absl::StrCat(
      "cuda: VRAM ", absl::StrFormat("%.2f", total_b / gib), " GiB total; dense ",
      absl::StrFormat("%.2f", m.stats.dense_bytes / gib), " GiB, KV ", absl::StrFormat("%.2f", m.stats.kv_bytes / gib),
      " GiB, workspaces ", absl::StrFormat("%.2f", m.stats.workspace_bytes / gib), " GiB, margin ",
      absl::StrFormat("%.2f", o.vram_margin_bytes / gib), " GiB, free before the arena ",
      absl::StrFormat("%.2f", free_b / gib), " GiB; arena ", slots, " of ", m.held_experts, " experts (",
      absl::StrFormat("%.1f", 100.0 * slots / m.held_experts), "%) x ", m.slot_bytes,
      " B = ", absl::StrFormat("%.2f", m.stats.arena_bytes / gib), " GiB",
      o.placement == nullptr ? ""
                             : absl::StrCat(" (expert rank ", o.placement->rank(), " of ", o.placement->n_ranks(),
                                            " on GPU ", o.device, ": its share of ", m.total_experts, ")"));
  std::fprintf(stderr, "%s\n", engine->budget_report_.c_str());
  // A full arena is filled here (above: never exported); a partial one exported over CUDA IPC is
  // filled by mer-residency, on demand and ahead of it.
  if (slots == m.held_experts) {
    ASSIGN_OR_RETURN(const int64_t loaded, engine->Preload());
    std::fprintf(stderr, "cuda: preloaded all %lld experts\n", static_cast<long long>(loaded));
  }
  return engine;
}

// ---------------------------------------------------------------------------------------------
// The step.

absl::Status CudaEngine::Impl::Validate(absl::Span<const BatchToken> batch) {
  return CheckBatch(batch, BatchLimits{o.max_batch_tokens, c.n_vocab, o.max_sequences, o.max_context_tokens}, seq_len,
                    &next_pos, &seen);
}

void CudaEngine::Impl::EnqueueExperts(int layer, int n, const ExpertInput& x_act, int u_begin, int u_count) {
  const ModelConfig& cc = c;
  const ExpertLayout& el = expert_layout[layer];
  cuda::ExpertArgs a{};
  a.type = DevTypeOf(el.gate.type);
  a.up_type = DevTypeOf(el.up.type);
  a.down_type = DevTypeOf(el.down.type);
  a.arena = arena;
  a.slot_bytes = slot_bytes;
  a.slot_table = slot_table + int64_t(layer) * cc.n_expert;
  a.up_offset = el.up.offset;
  a.down_offset = el.down.offset;
  a.n_embd = cc.n_embd;
  a.n_ff = cc.n_ff_exp;
  a.k = cc.n_expert_used;
  a.n_used = groups.n_used;
  a.used = groups.used;
  a.begin = groups.begin;
  a.pairs = groups.pairs;
  a.u_begin = u_begin;
  a.u_count = u_count;
  a.held = held != nullptr ? held + int64_t(layer) * cc.n_expert : nullptr;
  const int n_pairs = n * cc.n_expert_used;
  if (a.up_type == a.type) {
    cuda::LaunchExpertGateUp(a, x_act.gate, h, n, stream);
    Mark("gate_up");
  } else {
    cuda::LaunchExpertGateUpMixed(a, x_act.gate, x_act.up, h, n, stream);
    Mark("gate, up (mixed types)");
  }
  if (n == 1 && cuda::ExpertDownConvertsInput(a.down_type, cc.n_ff_exp)) {
    cuda::LaunchExpertDownFromF32(a, h, expert_out, stream);
    Mark("down (+ conversion)");
    return;
  }
  const DevAct h_act = ActB(ActType(el.down.type), cc.n_ff_exp);
  cuda::LaunchQuantize(h, cc.n_ff_exp, n_pairs, cc.n_ff_exp, h_act, stream);
  Mark("quantize h");
  cuda::LaunchExpertDown(a, h_act, expert_out, n, stream);
  Mark("down");
}

// RMSNorm of residual rows (rows[i], or i) into f32 y (may be nullptr) and the activations act.
// Q8_K quantizes whole 256-element blocks (kquant_quantize.cuh) and Q8_1 sums its quants, which
// the norm's per-element store cannot: for them the norm writes f32 rows (into y, else into xn,
// which only the MoE block's norm uses) and a conversion follows.
void CudaEngine::Impl::RmsNormAct(const int32_t* rows, int n_rows, const cuda::MoeCombine& combine, const float* w,
                                  float* y, const DevAct& act) {
  const int64_t E = c.n_embd;
  if (cuda::KernelsStoreAct(act.type)) {
    cuda::LaunchRmsNorm(x, E, rows, n_rows, combine, w, c.rms_norm_eps, E, y, E, act, stream);
    return;
  }
  float* f = y != nullptr ? y : xn;
  cuda::LaunchRmsNorm(x, E, rows, n_rows, combine, w, c.rms_norm_eps, E, f, E, DevAct{}, stream);
  cuda::LaunchQuantize(f, E, n_rows, E, act, stream);
}

absl::Status CudaEngine::Impl::EnqueueLayer(int layer, int n, bool host_path) {
  const DevLayer& L = layers[layer];
  const int64_t E = c.n_embd, QD = c.q_dim(), KD = c.kv_dim();
  const int32_t* d_pos = reinterpret_cast<const int32_t*>(step_input + in.pos);
  const int32_t* d_seq = reinterpret_cast<const int32_t*>(step_input + in.seq);
  const int64_t layer_kv = int64_t(layer) * o.max_sequences * o.max_context_tokens * KD;

  // Attention block. Its norm first adds the previous layer's MoE output into x. Q's activation
  // type goes to act_a; where K or V reads another (at most one other: Create), the norm also
  // writes f32 rows into xn (unused until the MoE block's norm) and they are converted to it in
  // act_b, as the CPU engine converts the normed rows once per type.
  const DevAct xa = ActA(ActType(L.wq_type), E);
  const int other_type = ActType(L.wk_type) != xa.type ? ActType(L.wk_type) : ActType(L.wv_type);
  const bool two_types = other_type != xa.type;
  const DevAct xb = ActB(other_type, E);
  RmsNormAct(nullptr, n, PreviousMoe(layer), L.attn_norm, two_types ? xn : nullptr, xa);
  Mark("attn_norm + combine");
  if (two_types) {
    cuda::LaunchQuantize(xn, E, n, E, xb, stream);
    Mark("quantize attn_norm (K/V type)");
  }
  const cuda::MatvecOutput qkv[3] = {{L.wq, q, QD, nullptr}, {L.wk, k, KD, nullptr}, {L.wv, v, KD, nullptr}};
  const DevAct* qkv_acts[3] = {&xa, ActType(L.wk_type) == xa.type ? &xa : &xb,
                               ActType(L.wv_type) == xa.type ? &xa : &xb};
  LaunchMatvecRuns(qkv, 3, qkv_acts, n, stream);
  Mark("qkv");
  cuda::QkNormRopeArgs r{};
  r.q = q;
  r.k = k;
  r.v = v;
  r.q_norm = L.q_norm;
  r.k_norm = L.k_norm;
  r.rope_cos = reinterpret_cast<const float*>(step_input + in.rope_cos);
  r.rope_sin = reinterpret_cast<const float*>(step_input + in.rope_sin);
  r.seq = d_seq;
  r.pos = d_pos;
  r.k_cache = k_cache + layer_kv;
  r.v_cache = v_cache + layer_kv;
  r.n_head = c.n_head;
  r.n_head_kv = c.n_head_kv;
  r.head_dim = c.head_dim;
  r.max_ctx = o.max_context_tokens;
  r.eps = c.rms_norm_eps;
  const DevAct aa = ActA(ActType(L.wo_type), QD);
  cuda::AttentionArgs at{};
  // A decode step's attention does the Q/K norm, RoPE and KV append itself (one launch less).
  at.fused_rope = n == 1 && !attention_split && !attention_flash && cuda::AttentionFusesQkNormRope(c.head_dim);
  if (at.fused_rope) {
    at.rope = r;
  } else {
    cuda::LaunchQkNormRope(r, n, stream);
    Mark("qk_norm_rope");
  }
  at.q = q;
  at.k_cache = k_cache + layer_kv;
  at.v_cache = v_cache + layer_kv;
  at.seq = d_seq;
  at.pos = d_pos;
  at.scores = scores;
  at.out = attn;
  at.n_head = c.n_head;
  at.n_head_kv = c.n_head_kv;
  at.head_dim = c.head_dim;
  at.max_ctx = o.max_context_tokens;
  at.split = attention_split;
  const bool attention_converts = cuda::AttentionConvertsOutput(c.head_dim) && cuda::KernelsStoreAct(aa.type);
  if (attention_converts) at.out_act = aa;
  if (attention_flash) {
    cuda::LaunchFlashAttention(at, n, stream);
    Mark("flash attention");
  } else {
    cuda::LaunchAttention(at, n, stream);
    Mark(at.fused_rope ? "qk_norm_rope + attention" : "attention");
  }
  if (!attention_converts) cuda::LaunchQuantize(attn, QD, n, QD, aa, stream);
  Mark("quantize attn");
  const cuda::MatvecOutput wo{L.wo, x, E, x};
  cuda::LaunchMatvec(&wo, 1, aa, n, stream);
  Mark("out_proj");

  // MoE block: norm, router, top-k and grouping on the GPU; its output is added into x by the
  // next norm (PreviousMoe).
  // The experts' input: in gate's activation type, and in up's where it differs (converted from
  // the norm's f32 rows in xn below, as the CPU engine converts the normed rows once per type).
  const ExpertLayout& el = expert_layout[layer];
  const DevAct ea = ActA(ActType(el.gate.type), E);
  const bool up_act = ActType(el.up.type) != ea.type;
  const ExpertInput x_act{ea, up_act ? DevAct{ActType(el.up.type), E, act_up, act_up_scales} : ea};
  const int32_t* layer_slots = slot_table + int64_t(layer) * c.n_expert;
  // A preselected route replaces the top-k after the router's launches (router_logits stay the
  // router's, for the given experts' weights): everything below reads chosen, chosen_w and groups.
  const bool given = routes_this_step && route_given[layer] != Given::kRouter;
  if (n == 1 && L.router_type == GgmlType::kF32 && cuda::RouterTopK1Supported(E, c.n_expert)) {
    // One launch for the norm, the router, top-k and the groups (Router1Norm), where the
    // experts' activation type allows it.
    cuda::Router1Args ra{};
    // The fused norm writes no f32 rows, which up's conversion needs.
    if (cuda::RouterTopK1NormSupported(ea.type) && !up_act) {
      ra.norm = cuda::Router1Norm{x, L.ffn_norm, c.rms_norm_eps, ea};
    } else {
      RmsNormAct(nullptr, n, cuda::MoeCombine{}, L.ffn_norm, xn, ea);
      Mark("ffn_norm");
    }
    ra.router = reinterpret_cast<const float*>(L.router.data);
    ra.x = xn;
    ra.n_embd = static_cast<int32_t>(E);
    ra.n_expert = c.n_expert;
    ra.k = c.n_expert_used;
    ra.norm_topk = c.norm_topk_prob;
    ra.logits = router_logits;
    ra.blocks_done = router_blocks_done;
    ra.chosen = chosen;
    ra.weights = chosen_w;
    ra.slot_table = given ? nullptr : layer_slots;  // no groups: the given route's follow
    ra.groups = groups;
    if (Predicts(layer, n, host_path || device_misses)) {
      cuda::Router1Next& p = ra.next;
      p.router = reinterpret_cast<const float*>(layers[layer + 1].router.data);
      p.logits = pred_logits;
      p.chosen = pred_chosen;
      p.weights = pred_w;
      p.slot_table = slot_table + int64_t(layer + 1) * c.n_expert;
      p.groups = pred_groups;
    }
    cuda::LaunchRouterTopK1(ra, stream);
    Mark(ra.norm.residual != nullptr ? "ffn_norm + router + topk" : "router + topk");
  } else {
    RmsNormAct(nullptr, n, cuda::MoeCombine{}, L.ffn_norm, xn, ea);
    Mark("ffn_norm");
    DevAct ra{cuda::kDevF32, E, reinterpret_cast<uint8_t*>(xn), nullptr};
    if (L.router_type != GgmlType::kF32) {
      ra = ActB(ActType(L.router_type), E);
      cuda::LaunchQuantize(xn, E, n, E, ra, stream);
    }
    const cuda::MatvecOutput ro{L.router, router_logits, c.n_expert, nullptr};
    cuda::LaunchMatvec(&ro, 1, ra, n, stream);
    if (!given) {
      cuda::LaunchRouterTopK(router_logits, n, c.n_expert, c.n_expert_used, c.norm_topk_prob, chosen, chosen_w,
                             layer_slots, &groups, stream);
      if (n > 1) cuda::LaunchMoeGroup(chosen, n * c.n_expert_used, c.n_expert, layer_slots, groups, stream);
    }
    Mark(given ? "router" : "router, topk, groups");
  }
  if (up_act) {
    cuda::LaunchQuantize(xn, E, n, E, x_act.up, stream);
    Mark("quantize ffn_norm (up type)");
  }
  if (given) EnqueueGivenRoute(layer, n);
  if (o.placement != nullptr) {
    cuda::LaunchRankLayerStart(chosen, n * c.n_expert_used, c.n_expert, o.placement->n_ranks(), o.placement->rank(),
                               expert_out, E, rank_counts, stream);
    Mark("rank: zero outputs, count");
  }
  if (host_path) {
    RETURN_IF_ERROR(ServeLayerExperts(layer, n, x_act));
    if (o.placement != nullptr) RETURN_IF_ERROR(ExchangeExperts(n));
    return absl::OkStatus();
  }
  if (device_misses) {
    // The device's decision: the layer's record to the miss service, then the wait at its gate
    // (open at once when every used expert is resident).
    cuda::MissPostArgs mp{};
    mp.groups = groups;
    mp.slot_table = layer_slots;
    mp.pred_chosen = Predicts(layer, n, true) ? pred_chosen : nullptr;
    mp.step = reinterpret_cast<const uint32_t*>(step_input + in.step);
    mp.record_head = record_head;
    mp.ring = record_ring_device;
    mp.ring_capacity = ring_capacity;
    mp.record_bytes = record_bytes;
    mp.gate = gates + layer;
    mp.layer = layer;
    mp.n_expert = c.n_expert;
    mp.k = c.n_expert_used;
    cuda::LaunchMissPost(mp, stream);
    Mark("miss post");
    WaitGate(layer);
    Mark("gate");
  }
  EnqueueExperts(layer, n, x_act, 0, std::min(c.n_expert, n * c.n_expert_used));
  if (o.placement != nullptr) RETURN_IF_ERROR(ExchangeExperts(n));
  return absl::OkStatus();
}

// The device exchange is enqueued on the stream (a graph captures it); the host's synchronises,
// sums on the host and copies the sum back before the next layer's norm reads it. Its time is the
// wait for the other ranks and the sum (SumAcrossRanks), not the copies.
absl::Status CudaEngine::Impl::ExchangeExperts(int n) {
  const size_t count = size_t(n) * c.n_expert_used * c.n_embd;
  if (o.device_exchange != nullptr) {
    RETURN_IF_ERROR(o.device_exchange->EnqueueSum(expert_out, count, stream));
    Mark("exchange (device)");
    return absl::OkStatus();
  }
  CHECK(!capturing);  // Run captures no step with a host exchange
  CUDA_CHECK(cudaMemcpyAsync(host_expert_out, expert_out, count * 4, cudaMemcpyDeviceToHost, stream));
  Sync();
  const auto t0 = std::chrono::steady_clock::now();
  const absl::Status summed = o.host_exchange->SumAcrossRanks(host_expert_out, count);
  exchange_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  stats.exchange_seconds_x1e6 = static_cast<int64_t>(exchange_us);
  RETURN_IF_ERROR(summed);
  CUDA_CHECK(cudaMemcpyAsync(expert_out, host_expert_out, count * 4, cudaMemcpyHostToDevice, stream));
  Mark("exchange (host)");
  return absl::OkStatus();
}

void CudaEngine::Impl::DropStaleGraphs() {
  if (o.device_exchange == nullptr || o.device_exchange->generation() == graphs_generation) return;
  for (auto* graphs : {&graph, &pipe_graph})
    for (auto& by_rows : *graphs)
      for (auto& by_split : by_rows)
        for (cudaGraphExec_t& g : by_split)
          if (g != nullptr) {
            CUDA_CHECK(cudaGraphExecDestroy(g));
            g = nullptr;
          }
  graphs_generation = o.device_exchange->generation();
}

absl::StatusOr<bool> CudaEngine::Impl::TakeRoutes(int n) {
  const int K = c.n_expert_used;
  bool any = false;
  for (int l = 0; l < c.n_layer; ++l) {
    const int64_t at = int64_t(l) * o.max_batch_tokens * K;
    bool has_weights = false;
    const bool given = route->Route(l, n, K, route_ids + at, route_weights + at, &has_weights);
    route_given[l] = !given ? Given::kRouter : has_weights ? Given::kIdsAndWeights : Given::kIds;
    if (given)
      RETURN_IF_ERROR(
          CheckPreselectedRoute(l, n, K, c.n_expert, route_ids + at, has_weights ? route_weights + at : nullptr));
    any = any || given;
  }
  return any;
}

// The copies read pinned memory that TakeRoutes filled before the step and that nothing changes
// until the step's final synchronisation; they wait for the router's kernels (a copy is no
// programmatic dependent of a kernel), and the kernels after them for the copies.
void CudaEngine::Impl::EnqueueGivenRoute(int layer, int n) {
  CHECK(!capturing);  // the routes change from step to step: Run captures no step that has any
  const int K = c.n_expert_used;
  const int64_t at = int64_t(layer) * o.max_batch_tokens * K, bytes = int64_t(n) * K * 4;
  CUDA_CHECK(cudaMemcpyAsync(chosen, route_ids + at, bytes, cudaMemcpyHostToDevice, stream));
  if (route_given[layer] == Given::kIdsAndWeights) {
    CUDA_CHECK(cudaMemcpyAsync(chosen_w, route_weights + at, bytes, cudaMemcpyHostToDevice, stream));
  } else {
    cuda::LaunchRouteWeights(router_logits, n, c.n_expert, K, c.norm_topk_prob, chosen, chosen_w, stream);
  }
  cuda::LaunchMoeGroup(chosen, n * K, c.n_expert, slot_table + int64_t(layer) * c.n_expert, groups, stream);
  Mark("preselected route, groups");
}

// Everything of one step after the input upload, up to the device logits.
void CudaEngine::Impl::EnqueueStep(int n, int n_out, bool host_path, bool argmax, absl::Status* status,
                                   const uint8_t* input, const int32_t* device_tokens) {
  const int64_t E = c.n_embd;
  CUDA_CHECK(cudaMemcpyAsync(step_input, input, in.bytes, cudaMemcpyHostToDevice, stream));
  const int32_t* tokens =
      device_tokens != nullptr ? device_tokens : reinterpret_cast<const int32_t*>(step_input + in.tokens);
  cuda::LaunchEmbed(embd_type, embd, embd_row_bytes, tokens, n, E, x, stream);
  Mark("input + embed");
  const bool paced = device_misses && !capturing;
  for (int l = 0; l < c.n_layer; ++l) {
    if (paced && l >= kEnqueueLayersAhead) miss_service->WaitForRecords(records_posted + l - kEnqueueLayersAhead + 1);
    *status = EnqueueLayer(l, n, host_path);
    if (!status->ok()) return;
  }
  if (paced) records_posted += c.n_layer;
  if (n_out == 0) return;
  const DevAct oa = ActA(ActType(output_type), E);
  RmsNormAct(reinterpret_cast<const int32_t*>(step_input + in.out_rows), n_out, PreviousMoe(c.n_layer), output_norm,
             nullptr, oa);
  const cuda::MatvecOutput lm{output, logits, c.n_vocab, nullptr};
  Mark("final_norm");
  cuda::LaunchMatvec(&lm, 1, oa, n_out, stream);
  Mark("lm_head");
  if (!argmax) return;
  cuda::LaunchArgmaxRows(logits, n_out, c.n_vocab, argmax_ids, argmax_scratch, o.max_batch_tokens, stream);
  Mark("argmax");
}

void CudaEngine::Impl::CaptureGraph(cudaGraphExec_t* exec, const std::function<void(absl::Status*)>& enqueue) {
  absl::Status status;
  cudaGraph_t graph;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  capturing = true;
  enqueue(&status);
  capturing = false;
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(status.ok());  // the device path returns no errors
  CUDA_CHECK(cudaGraphInstantiate(exec, graph, 0));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

// Step inputs: ids, positions, sequences, logits rows and the RoPE table (ggml's rope cache,
// computed on the host exactly as the CPU engine does).
int CudaEngine::Impl::FillInput(absl::Span<const BatchToken> batch, uint8_t* dst, int32_t* max_position) {
  *reinterpret_cast<uint32_t*>(dst + in.step) = ++step_number;
  const int half = c.head_dim / 2;
  int32_t* tokens = reinterpret_cast<int32_t*>(dst + in.tokens);
  int32_t* pos = reinterpret_cast<int32_t*>(dst + in.pos);
  int32_t* seq = reinterpret_cast<int32_t*>(dst + in.seq);
  int32_t* rows = reinterpret_cast<int32_t*>(dst + in.out_rows);
  float* rc = reinterpret_cast<float*>(dst + in.rope_cos);
  float* rs = reinterpret_cast<float*>(dst + in.rope_sin);
  int n_out = 0;
  *max_position = 0;
  for (size_t t = 0; t < batch.size(); ++t) {
    *max_position = std::max(*max_position, batch[t].position);
    tokens[t] = batch[t].token;
    pos[t] = batch[t].position;
    seq[t] = batch[t].sequence;
    if (batch[t].want_logits) rows[n_out++] = static_cast<int32_t>(t);
    cpu::RopeCache(batch[t].position, c.rope_freq_base, c.head_dim, rc + int64_t(t) * half, rs + int64_t(t) * half);
  }
  return n_out;
}

absl::Status CudaEngine::Forward(absl::Span<const BatchToken> batch, float* logits) {
  return Run(batch, logits, nullptr);
}

absl::Status CudaEngine::ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) {
  return Run(batch, nullptr, ids);
}

absl::Status CudaEngine::Run(absl::Span<const BatchToken> batch, float* logits, int32_t* ids) {
  Impl& m = *impl_;
  m.MakeCurrent();
  RETURN_IF_ERROR(m.Validate(batch));
  if (m.o.placement != nullptr && m.o.placement->replicas() > 0)  // every rank alike, before any exchange
    return absl::UnimplementedError("cuda expert ranks: replicated experts are not built");
  // A failed group until it is reset: nothing runs, least of all a graph captured with the
  // communicators its failure aborted.
  if (m.o.device_exchange != nullptr) RETURN_IF_ERROR(m.o.device_exchange->status());
  const ModelConfig& c = config_;
  const int n = static_cast<int>(batch.size());
  bool routed = false;
  if (m.route != nullptr) {
    ASSIGN_OR_RETURN(routed, m.TakeRoutes(n));
  }
  int32_t max_position = 0;
  const int n_out = m.FillInput(batch, m.host_input, &max_position);

  if (m.device_misses && m.observer != nullptr)
    return absl::UnimplementedError("a routing observer needs the host path (--miss-path host)");
  const bool host_path = (!m.AllResident() && !m.device_misses) || m.observer != nullptr;
  absl::Status status;
  if (m.device_misses) m.miss_service->StepLaunched();
  m.step_is_decode = n == 1;
  m.attention_flash = m.AttentionFlashFor(batch);
  m.attention_split = !m.attention_flash && m.AttentionSplitAt(max_position);
  m.stats.attention_split_steps += m.attention_split;
  m.stats.attention_flash_steps += m.attention_flash;
  m.Mark("start");
  const bool argmax = ids != nullptr && n_out > 0;
  m.routes_this_step = routed;
  m.DropStaleGraphs();
  if (!host_path && !routed && n == 1 && m.o.use_graphs && !m.o.profile_kernels &&
      (!m.device_misses || m.device_graphs) && m.o.host_exchange == nullptr) {
    cudaGraphExec_t& exec = m.graph[n_out][m.attention_split][argmax];
    if (exec == nullptr)
      m.CaptureGraph(&exec, [&](absl::Status* s) { m.EnqueueStep(n, n_out, false, argmax, s, m.host_input); });
    CUDA_CHECK(cudaGraphLaunch(exec, m.stream));
    ++m.stats.graph_launches;
    if (m.device_misses) m.records_posted += c.n_layer;
  } else {
    m.EnqueueStep(n, n_out, host_path, argmax, &status, m.host_input);
  }
  // The other ranks of an expert-parallel group wait for this one's outputs: none can finish.
  if (!status.ok() && m.o.host_exchange != nullptr) m.o.host_exchange->Fail(status);
  if (!status.ok() && m.o.device_exchange != nullptr) m.o.device_exchange->Fail(status);
  // The outputs go to the caller's memory (pageable: the copy is synchronous): on the device miss
  // path only once the step is done (WaitEvent says why).
  if (m.device_misses) m.WaitStepDone();
  if (status.ok() && argmax) {
    CUDA_CHECK(cudaMemcpyAsync(ids, m.argmax_ids, int64_t(n_out) * 4, cudaMemcpyDeviceToHost, m.stream));
    m.Mark("ids D2H");
  } else if (status.ok() && n_out > 0) {
    CUDA_CHECK(cudaMemcpyAsync(logits, m.logits, int64_t(n_out) * c.n_vocab * 4, cudaMemcpyDeviceToHost, m.stream));
    m.Mark("logits D2H");
  }
  CUDA_CHECK(cudaMemcpyAsync(m.host_lookups, m.lookups_total, 8, cudaMemcpyDeviceToHost, m.stream));
  m.CopyRankCounts();
  if (m.device_misses) {
    CUDA_CHECK(cudaStreamSynchronize(m.stream));  // the copies of a finished step: part of its sync
  } else {
    m.Sync();
  }
  m.CollectMarks();
  m.TakeDeviceCounts();
  // A sum that another rank's failure abandoned finished with meaningless values.
  if (status.ok() && m.o.device_exchange != nullptr) status = m.o.device_exchange->status();
  if (m.device_misses) {
    m.miss_service->StepDone();
    if (status.ok()) status = m.miss_service->TakeError();  // a layer read the poison slot
  }
  if (m.prefetch_layer >= 0) {
    // A step that failed before consuming its prefetch: the copies must land before the next
    // step reads the table that lists them, and before their source memory is released.
    CUDA_CHECK(cudaEventSynchronize(m.prefetch_done));
    ++m.stats.host_syncs;
    m.prefetch_layer = -1;
  }
  m.ReleasePrefetchHold(true);
  m.ReleaseHeld();
  m.routes_this_step = false;
  ++m.stats.forward_calls;
  m.stats.tokens += n;
  if (status.ok() && m.o.placement == nullptr) m.stats.expert_pairs += int64_t(n) * c.n_expert_used * c.n_layer;
  if (!status.ok()) {
    for (const BatchToken& b : batch) m.seq_len[b.sequence] = std::min(m.seq_len[b.sequence], b.position);
    return status;
  }
  for (const BatchToken& b : batch) m.seq_len[b.sequence] = b.position + 1;
  return absl::OkStatus();
}

absl::Status CudaEngine::DecodeGreedy(int sequence, int32_t token, int32_t position, int max_steps,
                                      const std::function<bool(int32_t)>& on_token) {
  Impl& m = *impl_;
  m.MakeCurrent();
  const bool one_graph_per_step = (m.AllResident() || (m.device_misses && m.device_graphs)) && m.observer == nullptr &&
                                  m.route == nullptr && m.o.use_graphs && !m.o.profile_kernels &&
                                  m.o.host_exchange == nullptr &&
                                  (m.o.placement == nullptr || m.o.placement->replicas() == 0);
  if (!one_graph_per_step || max_steps < 1)
    return ComputeBackend::DecodeGreedy(sequence, token, position, max_steps, on_token);
  return DecodePipelined(sequence, token, position, max_steps, on_token);
}

// Step i feeds position + i from input set i % 2. Step i + 1 is launched before the host waits for
// step i: its inputs (position, RoPE table) are known, and its token is read on the device from
// step i's argmax_ids, which step i's graph has also copied to pipe_ids[i % 2] by the time step
// i + 1's graph starts (one stream). The host refills set i % 2 for step i + 2 only after step i's
// event, so no graph reads a set while it is rewritten. When on_token stops early, the step
// launched ahead has run for nothing: it is waited for, and its KV entry, at the position after
// the last one fed, stays outside the sequence (seq_len) until that position is fed again.
absl::Status CudaEngine::DecodePipelined(int sequence, int32_t token, int32_t position, int max_steps,
                                         const std::function<bool(int32_t)>& on_token) {
  Impl& m = *impl_;
  const BatchToken first{token, position, sequence, true};
  RETURN_IF_ERROR(m.Validate(absl::MakeConstSpan(&first, 1)));
  if (m.o.device_exchange != nullptr) RETURN_IF_ERROR(m.o.device_exchange->status());
  m.DropStaleGraphs();
  // A step past the context fails as ForwardArgmax's loop would, once the steps before it are done.
  const int in_context = std::min(max_steps, m.o.max_context_tokens - position);
  const auto launch = [&](int i) {
    const int b = i % 2;
    const BatchToken step{token, position + i, sequence, true};
    int32_t max_position = 0;
    m.FillInput(absl::MakeConstSpan(&step, 1), m.pipe_input[b], &max_position);
    m.step_is_decode = true;
    m.attention_flash = false;
    m.attention_split = m.AttentionSplitAt(max_position);
    m.stats.attention_split_steps += m.attention_split;
    const bool from_device = i > 0;
    cudaGraphExec_t& exec = m.pipe_graph[b][from_device][m.attention_split];
    if (exec == nullptr)
      m.CaptureGraph(&exec, [&](absl::Status* s) {
        m.EnqueueStep(1, 1, false, true, s, m.pipe_input[b], from_device ? m.argmax_ids : nullptr);
        CUDA_CHECK(cudaMemcpyAsync(m.pipe_ids + b, m.argmax_ids, 4, cudaMemcpyDeviceToHost, m.stream));
      });
    if (m.device_misses) m.miss_service->StepLaunched();
    CUDA_CHECK(cudaGraphLaunch(exec, m.stream));
    if (m.device_misses) m.records_posted += m.c.n_layer;
    CUDA_CHECK(cudaEventRecord(m.pipe_done[b], m.stream));
    ++m.stats.graph_launches;
  };
  int launched = 0;
  if (in_context > 0) launch(launched++);
  int done = 0;
  bool more = true;
  while (done < launched) {
    if (more && launched < in_context) launch(launched++);
    m.WaitEvent(m.pipe_done[done % 2]);
    ++m.stats.host_syncs;
    if (m.device_misses) {
      m.miss_service->StepDone();
      if (m.miss_service->HasError()) {
        // A layer of this step read the poison slot. The step launched ahead may read it too:
        // it is waited for before the poisoned entries go back to -1, and both are dropped.
        m.Sync();
        for (int i = done + 1; i < launched; ++i) m.miss_service->StepDone();
        m.seq_len[sequence] = position + done;
        return m.miss_service->TakeError();
      }
    }
    if (m.o.device_exchange != nullptr) {
      // Another rank failed: this step's sums, and the one launched ahead's, were abandoned.
      if (absl::Status exchanged = m.o.device_exchange->status(); !exchanged.ok()) {
        m.Sync();
        m.seq_len[sequence] = position + done;
        return exchanged;
      }
    }
    const int32_t id = m.pipe_ids[done % 2];
    if (!more) break;  // the step launched ahead, waited for and dropped
    m.seq_len[sequence] = position + done + 1;
    ++m.stats.forward_calls;
    ++m.stats.tokens;
    if (m.o.placement == nullptr) m.stats.expert_pairs += int64_t(m.c.n_expert_used) * m.c.n_layer;
    ++done;
    more = on_token(id) && done < max_steps;
  }
  CUDA_CHECK(cudaMemcpyAsync(m.host_lookups, m.lookups_total, 8, cudaMemcpyDeviceToHost, m.stream));
  m.CopyRankCounts();
  m.Sync();
  m.TakeDeviceCounts();
  if (more && done < max_steps) {
    const BatchToken past{0, position + done, sequence, true};
    return m.Validate(absl::MakeConstSpan(&past, 1));  // the context's end
  }
  return absl::OkStatus();
}

void CudaEngine::ClearSequence(int sequence) {
  CHECK(sequence >= 0 && sequence < options_.max_sequences);
  impl_->seq_len[sequence] = 0;
}

int32_t CudaEngine::sequence_length(int sequence) const { return impl_->seq_len[sequence]; }

void CudaEngine::set_routing_observer(RoutingObserver* observer) { impl_->observer = observer; }

absl::Status CudaEngine::set_route_override(RouteOverride* route) {
  Impl& m = *impl_;
  m.MakeCurrent();
  if (route != nullptr && m.route_ids == nullptr) {
    const int64_t bytes = int64_t(config_.n_layer) * options_.max_batch_tokens * config_.n_expert_used * 4;
    void* ids = nullptr;
    void* weights = nullptr;
    if (cudaMallocHost(&ids, bytes) != cudaSuccess) ids = nullptr;
    if (ids != nullptr && cudaMallocHost(&weights, bytes) != cudaSuccess) weights = nullptr;
    if (weights == nullptr) {
      (void)cudaGetLastError();
      if (ids != nullptr) CUDA_CHECK(cudaFreeHost(ids));
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMallocHost of 2 x ", bytes, " bytes for the preselected routes failed"));
    }
    m.route_ids = static_cast<int32_t*>(ids);
    m.route_weights = static_cast<float*>(weights);
    m.route_given.assign(config_.n_layer, Impl::Given::kRouter);
  }
  m.route = route;
  return absl::OkStatus();
}

std::string CudaEngine::KernelProfile() const {
  std::string out;
  for (int decode : {0, 1}) {
    const auto& table = impl_->kernel_ms[decode];
    if (table.empty()) continue;
    double total = 0;
    for (const auto& [name, v] : table) total += v.first;
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, v] : table)
      rows.push_back({v.first, absl::StrFormat("  %-22s %9.3f ms %6.1f%% %7lld x %8.2f us\n", name, v.first,
                                               100 * v.first / total, (long long)v.second, 1e3 * v.first / v.second)});
    std::sort(rows.rbegin(), rows.rend());
    absl::StrAppend(&out, decode ? "decode steps" : "multi-token steps", absl::StrFormat(": %.3f ms\n", total));
    for (const auto& r : rows) absl::StrAppend(&out, r.second);
  }
  return out;
}

BackendCounters CudaEngine::counters() const {
  Impl& m = *impl_;
  m.MakeCurrent();
  m.SampleVram();
  m.stats.device = true;
  m.stats.gpu = m.o.device;
  m.stats.arena_resident = m.resident;
  BackendCounters c = m.stats;
  if (m.miss_service != nullptr) {
    // The device path's misses are the experts its service had placed; its evictions, the
    // published experts it retired (mer-residency counts its uploads on its own page).
    const cuda::VramMissServiceStats ms = m.miss_service->stats();
    c.expert_misses += static_cast<int64_t>(ms.placed);
    c.evictions += static_cast<int64_t>(ms.retired);
    c.upload_seconds_x1e6 += static_cast<int64_t>(ms.serve_us);
    c.device_routing_records = static_cast<int64_t>(ms.records);
    c.device_served_layers = static_cast<int64_t>(ms.layers_served);
  }
  return c;
}

}  // namespace mer
