#include "services/compute/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/quant/quant.h"
#include "services/compute/cpu/cpu_ops.h"
#include "services/compute/cuda/attention.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/embed.cuh"
#include "services/compute/cuda/matvec.cuh"
#include "services/compute/cuda/moe_combine.cuh"
#include "services/compute/cuda/moe_experts.cuh"
#include "services/compute/cuda/moe_group.cuh"
#include "services/compute/cuda/qk_norm_rope.cuh"
#include "services/compute/cuda/quantize.cuh"
#include "services/compute/cuda/repack.cuh"
#include "services/compute/cuda/rms_norm.cuh"
#include "services/compute/cuda/router_topk.cuh"

namespace mer {
namespace {

using cuda::DevAct;
using cuda::DevMatrix;

constexpr int64_t kAlign = 256;
int64_t AlignUp(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

bool SupportedType(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16 || t == GgmlType::kQ8_0;
}

int DevTypeOf(GgmlType t) { return static_cast<int>(t); }  // DevType mirrors GgmlType's numbers

int ActType(GgmlType weight_type) { return DevTypeOf(ActivationTypeFor(weight_type)); }

int64_t MatrixBytes(const MatrixView& m) { return m.rows * m.row_bytes(); }

// The one type of every expert matrix: per layer from the source, or from the weights' merged
// expert tensors where the source cannot tell and the file has them.
absl::StatusOr<GgmlType> ExpertTypeOf(const ModelWeights& weights, const ExpertSource& experts) {
  std::optional<GgmlType> type;
  for (int l = 0; l < static_cast<int>(weights.layers.size()); ++l) {
    std::optional<ExpertTypes> t = experts.expert_types(l);
    const LayerWeights& L = weights.layers[l];
    if (!t && L.gate_exps.data != nullptr) t = ExpertTypes{L.gate_exps.type, L.up_exps.type, L.down_exps.type};
    if (!t)
      return absl::FailedPreconditionError(absl::StrCat(
          "cuda backend: neither the expert source nor the model file gives layer ", l, "'s expert types"));
    for (GgmlType g : {t->gate, t->up, t->down})
      if (!SupportedType(g))
        return absl::UnimplementedError(absl::StrCat("cuda backend: expert tensor type ", TypeName(g),
                                                     " is not supported yet (F32, F16, BF16, Q8_0)"));
    if (!type) type = t->gate;
    if (t->gate != *type || t->up != *type || t->down != *type)
      return absl::UnimplementedError("cuda backend: all expert matrices must share one type");
  }
  if (!type) return absl::InvalidArgumentError("cuda backend: the model has no layers");
  return *type;
}

// MER_CUDA_DEBUG=1 logs the stages of Create to stderr (start-up problems on a new machine).
void DebugLog(const char* stage) {
  static const bool on = std::getenv("MER_CUDA_DEBUG") != nullptr;
  if (on) std::fprintf(stderr, "cuda: %s\n", stage);
}

// A bump allocator over one cudaMalloc: every buffer of a kind is carved at Create.
class DevicePool {
 public:
  void Reserve(int64_t bytes) { size_ += AlignUp(bytes); }
  absl::Status Allocate(const char* what) {
    if (size_ == 0) return absl::OkStatus();
    const cudaError_t e = cudaMalloc(&base_, size_);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc of ", size_, " bytes for ", what,
                                                       " failed: ", cudaGetErrorString(e)));
    }
    return absl::OkStatus();
  }
  template <typename T>
  T* Take(int64_t bytes) {
    CHECK(used_ + AlignUp(bytes) <= size_);
    T* p = reinterpret_cast<T*>(static_cast<uint8_t*>(base_) + used_);
    used_ += AlignUp(bytes);
    return p;
  }
  int64_t size() const { return size_; }
  void Free() {
    if (base_ != nullptr) CUDA_CHECK(cudaFree(base_));
    base_ = nullptr;
  }

 private:
  void* base_ = nullptr;
  int64_t size_ = 0;
  int64_t used_ = 0;
};

struct DevLayer {
  const float* attn_norm;  // f32 [n_embd]
  const float* q_norm;     // f32 [head_dim]
  const float* k_norm;     // f32 [head_dim]
  const float* ffn_norm;   // f32 [n_embd]
  DevMatrix wq, wk, wv, wo, router;
  GgmlType wq_type, wk_type, wv_type, wo_type, router_type;
};

// Host-pinned step inputs, copied to the device in one transfer per step.
struct StepInputLayout {
  int64_t tokens, pos, seq, out_rows, rope_cos, rope_sin, bytes;  // byte offsets
};

}  // namespace

struct CudaEngine::Impl {
  Impl(const ModelWeights& w, ExpertSource& s) : weights(w), source(s), c(w.config()) {}
  ~Impl();

  const ModelWeights& weights;
  ExpertSource& source;
  const ModelConfig c;
  CudaEngineOptions o;
  RoutingObserver* observer = nullptr;
  cudaStream_t stream = nullptr;

  DevicePool dense_pool, work_pool, arena_pool;

  // Dense weights.
  int embd_type = 0;
  const uint8_t* embd = nullptr;  // GGUF layout [n_vocab, n_embd]
  int64_t embd_row_bytes = 0;
  DevMatrix output;               // [n_vocab, n_embd]
  GgmlType output_type = GgmlType::kF32;
  const float* output_norm = nullptr;
  std::vector<DevLayer> layers;

  // Experts: type and per-matrix bytes (equal for every layer, checked at Create).
  GgmlType expert_type = GgmlType::kF32;
  int64_t gate_bytes = 0, up_bytes = 0, down_bytes = 0, expert_bytes = 0;

  // KV cache, f32 [layer][sequence][position][kv_dim].
  float* k_cache = nullptr;
  float* v_cache = nullptr;

  // Workspaces for T = max_batch_tokens tokens (K = top-k, W = widest activation row).
  float* x = nullptr;            // f32 [T, n_embd] residual stream
  float* xn = nullptr;           // f32 [T, n_embd]
  float* q = nullptr;            // f32 [T, q_dim]
  float* k = nullptr;            // f32 [T, kv_dim]
  float* v = nullptr;            // f32 [T, kv_dim]
  float* attn = nullptr;         // f32 [T, q_dim]
  float* scores = nullptr;       // f32 [T * n_head, AttentionScoresStride(max_ctx)]
  float* router_logits = nullptr;// f32 [T, n_expert]
  int32_t* chosen = nullptr;     // int32 [T, K]
  float* chosen_w = nullptr;     // f32 [T, K]
  float* h = nullptr;            // f32 [T * K, n_ff]
  float* expert_out = nullptr;   // f32 [T * K, n_embd]
  float* logits = nullptr;       // f32 [T, n_vocab]
  uint8_t* act_a = nullptr;      // activations [T, max(n_embd, q_dim)] (+ scales)
  float* act_a_scales = nullptr;
  uint8_t* act_b = nullptr;      // activations [max(T * K * n_ff, T * n_embd)] (+ scales)
  float* act_b_scales = nullptr;
  cuda::MoeGroups groups{};
  unsigned long long* lookups_total = nullptr;
  uint8_t* step_input = nullptr; // StepInputLayout
  uint8_t* staging = nullptr;    // raw GGUF expert bytes [staging_experts, expert_bytes]
  int32_t* slot_table = nullptr; // int32 [n_layer, n_expert] -> slot or -1
  StepInputLayout in{};

  // Pinned host mirrors.
  uint8_t* host_input = nullptr;       // StepInputLayout
  int32_t* host_slot_table = nullptr;  // [n_layer * n_expert], authoritative; uploaded after changes
  int32_t* host_groups = nullptr;      // n_used, then used[n_expert]
  int32_t* host_chosen = nullptr;      // [T * K], for the routing observer

  // Arena bookkeeping (host side). LRU list over slots with sentinel n_slots: head = least recent.
  uint8_t* arena = nullptr;
  int64_t slot_bytes = 0;
  int32_t n_slots = 0;
  std::vector<int32_t> owner;      // [n_slots] key layer * n_expert + e, or -1
  std::vector<int32_t> lru_prev, lru_next;
  std::vector<uint64_t> pin_epoch; // [n_slots]: == epoch while the current pass uses it
  uint64_t epoch = 0;
  int64_t resident = 0;
  int64_t total_experts = 0;
  void* pinned_base = nullptr;     // cudaHostRegister'ed range of the experts' host memory

  // Sequences.
  std::vector<int32_t> seq_len, next_pos;
  std::vector<uint8_t> seen;
  std::vector<int32_t> out_rows;
  // The layer acquired from the source whose uploads may still be in flight (at most one): it is
  // released after the next synchronisation (ReleaseHeld).
  std::vector<int> pending_release;
  // ServeLayerExperts' and Preload's lists, reserved at Create.
  std::vector<int32_t> missing;          // experts of a pass not in the arena
  std::vector<ExpertWeights> views;      // of the group acquired
  std::vector<cuda::RepackJob> jobs;     // repack jobs not launched yet

  // CUDA graphs of a single-token, all-resident step, by number of logits rows (0 or 1).
  cudaGraphExec_t graph[2] = {nullptr, nullptr};

  CudaEngineStats stats;

  absl::Status Validate(absl::Span<const BatchToken> batch);
  void EnqueueStep(int n, int n_out, bool host_path_allowed, absl::Status* status);
  absl::Status EnqueueLayer(int layer, int n, bool host_path);
  absl::Status ServeLayerExperts(int layer, int n, const DevAct& x_act);
  void EnqueueExperts(int layer, int n, const DevAct& x_act, int u_begin, int u_count);
  void UploadExpert(int layer, int expert, const ExpertWeights& w, int32_t slot,
                    std::vector<cuda::RepackJob>* jobs, int* staged);
  void FlushRepack(std::vector<cuda::RepackJob>* jobs, int* staged);
  int32_t TakeVictim();
  void Touch(int32_t slot);
  // Releases the layer held from the source; call after a synchronisation saw its copies complete.
  void ReleaseHeld() {
    for (int layer : pending_release) source.ReleaseLayer(layer);
    pending_release.clear();
  }
  // FailedPrecondition unless the source's view of (layer, expert) has the arena's types and shapes.
  absl::Status CheckView(int layer, int expert, const ExpertWeights& w) const;
  // Acquires group of `layer` into views (and holds it, pending_release), checked.
  absl::Status AcquireGroup(int layer, absl::Span<const int32_t> group);
  void Sync() {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    ++stats.host_syncs;
  }
  void SampleVram() {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    stats.vram_total_bytes = static_cast<int64_t>(total_b);
    stats.vram_used_bytes = static_cast<int64_t>(total_b - free_b);
    stats.vram_used_peak_bytes = std::max(stats.vram_used_peak_bytes, stats.vram_used_bytes);
  }
  DevAct ActA(int type, int64_t stride) const { return DevAct{type, stride, act_a, act_a_scales}; }
  DevAct ActB(int type, int64_t stride) const { return DevAct{type, stride, act_b, act_b_scales}; }
  bool AllResident() const { return resident == total_experts; }
};

CudaEngine::Impl::~Impl() {
  if (stream != nullptr) CUDA_CHECK(cudaStreamSynchronize(stream));
  for (cudaGraphExec_t& g : graph)
    if (g != nullptr) CUDA_CHECK(cudaGraphExecDestroy(g));
  if (pinned_base != nullptr) CUDA_CHECK(cudaHostUnregister(pinned_base));
  for (void* p : {static_cast<void*>(host_input), static_cast<void*>(host_slot_table),
                  static_cast<void*>(host_groups), static_cast<void*>(host_chosen)})
    if (p != nullptr) CUDA_CHECK(cudaFreeHost(p));
  dense_pool.Free();
  work_pool.Free();
  arena_pool.Free();
  if (stream != nullptr) CUDA_CHECK(cudaStreamDestroy(stream));
}

bool CudaEngine::DeviceAvailable() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

CudaEngine::CudaEngine(const ModelConfig& config, const CudaEngineOptions& options,
                       std::unique_ptr<Impl> impl)
    : config_(config), options_(options), impl_(std::move(impl)) {}

CudaEngine::~CudaEngine() = default;

absl::StatusOr<std::unique_ptr<CudaEngine>> CudaEngine::Create(const ModelWeights& weights,
                                                              ExpertSource& experts,
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

  // Types. The experts' come from the source (the file's tensors, or an expert store's manifest
  // when the weights are a store's dense.gguf), else from the weights' expert tensors; every
  // expert matrix must have one type, which sizes the arena's slots.
  ASSIGN_OR_RETURN(m.expert_type, ExpertTypeOf(weights, experts));
  for (const LayerWeights& L : weights.layers) {
    for (const MatrixView* mv : {&L.wq, &L.wk, &L.wv, &L.wo, &L.router})
      if (!SupportedType(mv->type))
        return absl::UnimplementedError(absl::StrCat("cuda backend: tensor type ", TypeName(mv->type),
                                                     " is not supported yet (F32, F16, BF16, Q8_0)"));
    if (L.wq.type != L.wk.type || L.wq.type != L.wv.type)
      return absl::UnimplementedError("cuda backend: Q, K and V must share one type");
  }
  if (!SupportedType(weights.output.type) || !SupportedType(weights.token_embd.type))
    return absl::UnimplementedError("cuda backend: unsupported type of token_embd or output");
  // gate, up: [n_ff_exp rows, n_embd cols]; down: [n_embd rows, n_ff_exp cols].
  m.gate_bytes = int64_t(c.n_ff_exp) * RowBytes(m.expert_type, c.n_embd);
  m.up_bytes = m.gate_bytes;
  m.down_bytes = int64_t(c.n_embd) * RowBytes(m.expert_type, c.n_ff_exp);
  m.expert_bytes = m.gate_bytes + m.up_bytes + m.down_bytes;
  m.slot_bytes = AlignUp(m.expert_bytes);
  m.total_experts = int64_t(c.n_layer) * c.n_expert;

  // Dense weights: sizes, then upload through a staging buffer and the repack kernel.
  int64_t largest = 0;
  auto reserve_matrix = [&](const MatrixView& mv) {
    m.dense_pool.Reserve(MatrixBytes(mv));
    largest = std::max(largest, MatrixBytes(mv));
  };
  m.dense_pool.Reserve(MatrixBytes(weights.token_embd));
  reserve_matrix(weights.output);
  m.dense_pool.Reserve(int64_t(c.n_embd) * 4);
  for (const LayerWeights& L : weights.layers) {
    for (const MatrixView* mv : {&L.wq, &L.wk, &L.wv, &L.wo, &L.router}) reserve_matrix(*mv);
    m.dense_pool.Reserve(int64_t(c.n_embd) * 4 * 2);
    m.dense_pool.Reserve(int64_t(c.head_dim) * 4 * 2);
  }
  RETURN_IF_ERROR(m.dense_pool.Allocate("dense weights"));
  uint8_t* dense_staging = nullptr;
  {
    const cudaError_t e = cudaMalloc(&dense_staging, largest);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError("cudaMalloc of the dense-weight staging buffer failed");
    }
  }
  auto upload_raw = [&](const void* src, int64_t bytes) {
    uint8_t* d = m.dense_pool.Take<uint8_t>(bytes);
    CUDA_CHECK(cudaMemcpyAsync(d, src, bytes, cudaMemcpyHostToDevice, m.stream));
    return d;
  };
  auto upload_matrix = [&](const MatrixView& mv) {
    const int64_t bytes = MatrixBytes(mv);
    uint8_t* d = m.dense_pool.Take<uint8_t>(bytes);
    CUDA_CHECK(cudaMemcpyAsync(dense_staging, mv.data, bytes, cudaMemcpyHostToDevice, m.stream));
    const cuda::RepackJob job{dense_staging, d, bytes, mv.cols};
    cuda::LaunchRepack(DevTypeOf(mv.type), &job, 1, m.stream);
    CUDA_CHECK(cudaStreamSynchronize(m.stream));
    return DevMatrix{DevTypeOf(mv.type), mv.rows, mv.cols, d};
  };
  m.embd_type = DevTypeOf(weights.token_embd.type);
  m.embd_row_bytes = weights.token_embd.row_bytes();
  m.embd = upload_raw(weights.token_embd.data, MatrixBytes(weights.token_embd));
  m.output = upload_matrix(weights.output);
  m.output_type = weights.output.type;
  m.output_norm = reinterpret_cast<const float*>(upload_raw(weights.output_norm, int64_t(c.n_embd) * 4));
  for (const LayerWeights& L : weights.layers) {
    DevLayer d;
    d.attn_norm = reinterpret_cast<const float*>(upload_raw(L.attn_norm, int64_t(c.n_embd) * 4));
    d.ffn_norm = reinterpret_cast<const float*>(upload_raw(L.ffn_norm, int64_t(c.n_embd) * 4));
    d.q_norm = reinterpret_cast<const float*>(upload_raw(L.q_norm, int64_t(c.head_dim) * 4));
    d.k_norm = reinterpret_cast<const float*>(upload_raw(L.k_norm, int64_t(c.head_dim) * 4));
    d.wq = upload_matrix(L.wq);
    d.wk = upload_matrix(L.wk);
    d.wv = upload_matrix(L.wv);
    d.wo = upload_matrix(L.wo);
    d.router = upload_matrix(L.router);
    d.wq_type = L.wq.type;
    d.wk_type = L.wk.type;
    d.wv_type = L.wv.type;
    d.wo_type = L.wo.type;
    d.router_type = L.router.type;
    m.layers.push_back(d);
  }
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  CUDA_CHECK(cudaFree(dense_staging));
  DebugLog("dense weights uploaded");
  m.stats.dense_bytes = m.dense_pool.size();

  // KV cache and workspaces.
  const int64_t T = o.max_batch_tokens, K = c.n_expert_used, E = c.n_embd, QD = c.q_dim(),
                KD = c.kv_dim(), F = c.n_ff_exp, NE = c.n_expert, V = c.n_vocab;
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
  m.in.bytes = m.in.rope_sin + AlignUp(T * half * 4);
  DevicePool& w = m.work_pool;
  const int64_t f32_sizes[] = {T * E, T * E, T * QD, T * KD, T * KD, T * QD, T * c.n_head * cuda::AttentionScoresStride(o.max_context_tokens),
                               T * NE, T * K, T * K * F, T * K * E, T * V};
  for (int64_t s : f32_sizes) w.Reserve(s * 4);
  w.Reserve(T * K * 4);                                  // chosen
  w.Reserve(act_a_elems * 4);
  w.Reserve(act_a_elems / 32 * 4);
  w.Reserve(act_b_elems * 4);
  w.Reserve(act_b_elems / 32 * 4);
  w.Reserve(8 + (NE + 1) * 4 * 2 + T * K * 4);            // groups
  w.Reserve(8);                                          // lookups_total
  w.Reserve(m.in.bytes);
  w.Reserve(int64_t(o.staging_experts) * m.slot_bytes);
  w.Reserve(m.total_experts * 4);
  RETURN_IF_ERROR(w.Allocate("workspaces"));
  m.x = w.Take<float>(T * E * 4);
  m.xn = w.Take<float>(T * E * 4);
  m.q = w.Take<float>(T * QD * 4);
  m.k = w.Take<float>(T * KD * 4);
  m.v = w.Take<float>(T * KD * 4);
  m.attn = w.Take<float>(T * QD * 4);
  m.scores = w.Take<float>(T * c.n_head * cuda::AttentionScoresStride(o.max_context_tokens) * 4);
  m.router_logits = w.Take<float>(T * NE * 4);
  m.chosen_w = w.Take<float>(T * K * 4);
  m.h = w.Take<float>(T * K * F * 4);
  m.expert_out = w.Take<float>(T * K * E * 4);
  m.logits = w.Take<float>(T * V * 4);
  m.chosen = w.Take<int32_t>(T * K * 4);
  m.act_a = w.Take<uint8_t>(act_a_elems * 4);
  m.act_a_scales = w.Take<float>(act_a_elems / 32 * 4);
  m.act_b = w.Take<uint8_t>(act_b_elems * 4);
  m.act_b_scales = w.Take<float>(act_b_elems / 32 * 4);
  uint8_t* g = w.Take<uint8_t>(8 + (NE + 1) * 4 * 2 + T * K * 4);
  m.groups.n_used = reinterpret_cast<int32_t*>(g);
  m.groups.n_missing = m.groups.n_used + 1;
  m.groups.used = m.groups.n_used + 2;
  m.groups.begin = m.groups.used + NE + 1;
  m.groups.pairs = m.groups.begin + NE + 1;
  m.lookups_total = w.Take<unsigned long long>(8);
  m.groups.lookups_total = m.lookups_total;
  m.step_input = w.Take<uint8_t>(m.in.bytes);
  m.staging = w.Take<uint8_t>(int64_t(o.staging_experts) * m.slot_bytes);
  m.slot_table = w.Take<int32_t>(m.total_experts * 4);
  // Rows of pairs a pass has not computed yet are quantized too: keep them finite.
  CUDA_CHECK(cudaMemsetAsync(m.h, 0, T * K * F * 4, m.stream));
  CUDA_CHECK(cudaMemsetAsync(m.lookups_total, 0, 8, m.stream));
  m.stats.workspace_bytes = w.size();
  {
    const cudaError_t e1 = cudaMalloc(&m.k_cache, kv_bytes);
    const cudaError_t e2 = e1 == cudaSuccess ? cudaMalloc(&m.v_cache, kv_bytes) : e1;
    if (e2 != cudaSuccess) {
      (void)cudaGetLastError();
      if (m.k_cache != nullptr) CUDA_CHECK(cudaFree(m.k_cache));
      m.k_cache = nullptr;
      return absl::ResourceExhaustedError(absl::StrCat("KV cache of ", 2 * kv_bytes,
                                                       " bytes does not fit; lower --ctx or sequences"));
    }
    m.stats.kv_bytes = 2 * kv_bytes;
  }

  DebugLog("workspaces and KV cache allocated");
  CUDA_CHECK(cudaMallocHost(&m.host_input, m.in.bytes));
  CUDA_CHECK(cudaMallocHost(&m.host_slot_table, m.total_experts * 4));
  CUDA_CHECK(cudaMallocHost(&m.host_groups, (NE + 2) * 4));
  CUDA_CHECK(cudaMallocHost(&m.host_chosen, T * K * 4));

  // The arena: what is left after everything above, less the margin, under the caps.
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  int64_t arena_max = static_cast<int64_t>(free_b) - o.vram_margin_bytes;
  if (o.vram_expert_budget_bytes >= 0) arena_max = std::min(arena_max, o.vram_expert_budget_bytes);
  int64_t slots = std::max<int64_t>(0, arena_max / m.slot_bytes);
  if (o.vram_expert_budget_fraction > 0)
    slots = std::min<int64_t>(slots, static_cast<int64_t>(o.vram_expert_budget_fraction * m.total_experts + 0.5));
  slots = std::min(slots, m.total_experts);
  if (slots < 1)
    return absl::ResourceExhaustedError(absl::StrCat("no VRAM left for the expert arena (", free_b,
                                                     " bytes free, margin ", o.vram_margin_bytes, ")"));
  m.n_slots = static_cast<int32_t>(slots);
  m.arena_pool.Reserve(slots * m.slot_bytes);
  RETURN_IF_ERROR(m.arena_pool.Allocate("the expert arena"));
  m.arena = m.arena_pool.Take<uint8_t>(slots * m.slot_bytes);
  m.stats.arena_bytes = slots * m.slot_bytes;
  m.stats.arena_slots = slots;
  m.stats.slot_bytes = m.slot_bytes;
  m.stats.total_experts = m.total_experts;
  m.owner.assign(slots, -1);
  m.pin_epoch.assign(slots, 0);
  m.lru_prev.resize(slots + 1);
  m.lru_next.resize(slots + 1);
  for (int32_t s = 0; s <= m.n_slots; ++s) {  // a ring through the sentinel n_slots
    m.lru_next[s] = s == m.n_slots ? 0 : s + 1;
    m.lru_prev[s] = s == 0 ? m.n_slots : s - 1;
  }
  if (m.n_slots == 0) m.lru_next[0] = m.lru_prev[0] = 0;
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
    const cudaError_t e = cudaHostRegister(reinterpret_cast<void*>(lo), hi - lo,
                                           cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (e == cudaSuccess) {
      m.pinned_base = reinterpret_cast<void*>(lo);
      m.stats.host_experts_pinned = true;
      std::fprintf(stderr, "cuda: pinned %.2f GiB of expert host memory in %.2f s\n",
                   (hi - lo) / 1073741824.0, secs);
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
      absl::StrFormat("%.2f", m.stats.dense_bytes / gib), " GiB, KV ",
      absl::StrFormat("%.2f", m.stats.kv_bytes / gib), " GiB, workspaces ",
      absl::StrFormat("%.2f", m.stats.workspace_bytes / gib), " GiB, margin ",
      absl::StrFormat("%.2f", o.vram_margin_bytes / gib), " GiB, free before the arena ",
      absl::StrFormat("%.2f", free_b / gib), " GiB; arena ", slots, " of ", m.total_experts,
      " experts (", absl::StrFormat("%.1f", 100.0 * slots / m.total_experts), "%) x ",
      m.slot_bytes, " B = ", absl::StrFormat("%.2f", m.stats.arena_bytes / gib), " GiB");
  std::fprintf(stderr, "%s\n", engine->budget_report_.c_str());
  if (slots == m.total_experts) {
    ASSIGN_OR_RETURN(const int64_t loaded, engine->Preload());
    std::fprintf(stderr, "cuda: preloaded all %lld experts\n", static_cast<long long>(loaded));
  }
  return engine;
}

// ---------------------------------------------------------------------------------------------
// The arena.

void CudaEngine::Impl::Touch(int32_t s) {
  // Unlink, then insert before the sentinel (most recent end).
  lru_next[lru_prev[s]] = lru_next[s];
  lru_prev[lru_next[s]] = lru_prev[s];
  const int32_t tail = lru_prev[n_slots];
  lru_next[tail] = s;
  lru_prev[s] = tail;
  lru_next[s] = n_slots;
  lru_prev[n_slots] = s;
}

int32_t CudaEngine::Impl::TakeVictim() {
  for (int32_t s = lru_next[n_slots]; s != n_slots; s = lru_next[s]) {
    if (pin_epoch[s] == epoch) continue;  // used by the pass being served
    if (owner[s] >= 0) {
      host_slot_table[owner[s]] = -1;
      --resident;
      ++stats.evictions;
    }
    owner[s] = -1;
    return s;
  }
  return -1;
}

void CudaEngine::Impl::FlushRepack(std::vector<cuda::RepackJob>* jobs, int* staged) {
  cuda::LaunchRepack(DevTypeOf(expert_type), jobs->data(), static_cast<int>(jobs->size()), stream);
  jobs->clear();
  *staged = 0;
}

void CudaEngine::Impl::UploadExpert(int layer, int expert, const ExpertWeights& ew, int32_t slot,
                                    std::vector<cuda::RepackJob>* jobs, int* staged) {
  uint8_t* dst = arena + int64_t(slot) * slot_bytes;
  const MatrixView* parts[3] = {&ew.gate, &ew.up, &ew.down};
  const int64_t offsets[3] = {0, gate_bytes, gate_bytes + up_bytes};
  const int64_t sizes[3] = {gate_bytes, up_bytes, down_bytes};
  if (expert_type == GgmlType::kQ8_0) {
    // Raw blocks into a staging buffer, then the repack kernel splits them into the slot.
    if (*staged == o.staging_experts) FlushRepack(jobs, staged);
    uint8_t* stage = staging + int64_t(*staged) * slot_bytes;
    for (int i = 0; i < 3; ++i) {
      CUDA_CHECK(cudaMemcpyAsync(stage + offsets[i], parts[i]->data, sizes[i], cudaMemcpyHostToDevice, stream));
      jobs->push_back({stage + offsets[i], dst + offsets[i], sizes[i], parts[i]->cols});
    }
    ++*staged;
  } else {
    for (int i = 0; i < 3; ++i)
      CUDA_CHECK(cudaMemcpyAsync(dst + offsets[i], parts[i]->data, sizes[i], cudaMemcpyHostToDevice, stream));
  }
  const int32_t key = layer * c.n_expert + expert;
  owner[slot] = key;
  host_slot_table[key] = slot;
  ++resident;
  stats.expert_upload_bytes += expert_bytes;
}

absl::Status CudaEngine::Impl::CheckView(int layer, int expert, const ExpertWeights& w) const {
  const auto ok = [&](const MatrixView& mv, int64_t rows, int64_t cols) {
    return mv.data != nullptr && mv.type == expert_type && mv.rows == rows && mv.cols == cols;
  };
  if (ok(w.gate, c.n_ff_exp, c.n_embd) && ok(w.up, c.n_ff_exp, c.n_embd) && ok(w.down, c.n_embd, c.n_ff_exp))
    return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cuda backend: layer ", layer, " expert ", expert, " from the expert source is not ", TypeName(expert_type),
      " [", c.n_ff_exp, " x ", c.n_embd, "] x 2 + [", c.n_embd, " x ", c.n_ff_exp, "], the arena's layout"));
}

absl::Status CudaEngine::Impl::AcquireGroup(int layer, absl::Span<const int32_t> group) {
  CHECK(pending_release.empty());  // a source hands out a layer once between releases
  views.resize(group.size());
  if (absl::Status s = source.AcquireLayer(layer, group, absl::MakeSpan(views)); !s.ok()) {
    source.ReleaseLayer(layer);  // as the CPU engine does: a failed acquire holds nothing
    return s;
  }
  pending_release.push_back(layer);
  for (size_t i = 0; i < group.size(); ++i) RETURN_IF_ERROR(CheckView(layer, group[i], views[i]));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaEngine::Preload() {
  Impl& m = *impl_;
  const ModelConfig& c = config_;
  const int group_max = std::max(1, m.source.max_experts_per_acquire());
  int64_t loaded = 0;
  absl::Status status;
  // Layer by layer, in groups the source can hand out at once; each group's copies are complete
  // (synchronised) before it is released.
  for (int l = 0; l < c.n_layer && m.resident < m.n_slots && status.ok(); ++l) {
    m.missing.clear();
    for (int e = 0; e < c.n_expert && m.resident + int64_t(m.missing.size()) < m.n_slots; ++e)
      if (m.host_slot_table[l * c.n_expert + e] < 0) m.missing.push_back(e);
    for (size_t g0 = 0; g0 < m.missing.size() && status.ok(); g0 += group_max) {
      const absl::Span<const int32_t> group(m.missing.data() + g0,
                                            std::min<size_t>(group_max, m.missing.size() - g0));
      status = m.AcquireGroup(l, group);
      if (status.ok()) {
        int staged = 0;
        ++m.epoch;
        for (size_t i = 0; i < group.size(); ++i) {
          const int32_t s = m.TakeVictim();
          CHECK(s >= 0);
          m.pin_epoch[s] = m.epoch;
          m.UploadExpert(l, group[i], m.views[i], s, &m.jobs, &staged);
          m.Touch(s);
          ++loaded;
        }
        if (!m.jobs.empty()) m.FlushRepack(&m.jobs, &staged);
      }
      CUDA_CHECK(cudaStreamSynchronize(m.stream));
      m.ReleaseHeld();
    }
  }
  // The device table follows the host's, also after a failure part way.
  CUDA_CHECK(cudaMemcpyAsync(m.slot_table, m.host_slot_table, m.total_experts * 4, cudaMemcpyHostToDevice, m.stream));
  CUDA_CHECK(cudaStreamSynchronize(m.stream));
  m.stats.expert_upload_bytes = 0;  // preloading is not a miss
  RETURN_IF_ERROR(status);
  return loaded;
}

// ---------------------------------------------------------------------------------------------
// The step.

absl::Status CudaEngine::Impl::Validate(absl::Span<const BatchToken> batch) {
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  if (batch.size() > static_cast<size_t>(o.max_batch_tokens))
    return absl::InvalidArgumentError(absl::StrCat("batch of ", batch.size(), " tokens exceeds max_batch_tokens ",
                                                   o.max_batch_tokens));
  next_pos.assign(seq_len.begin(), seq_len.end());
  seen.assign(o.max_sequences, 0);
  for (const BatchToken& b : batch) {
    if (b.token < 0 || b.token >= c.n_vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", b.token, " is outside the vocabulary [0, ", c.n_vocab, ")"));
    if (b.sequence < 0 || b.sequence >= o.max_sequences)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b.sequence, " out of range"));
    if (b.position < 0 || b.position >= o.max_context_tokens)
      return absl::InvalidArgumentError(absl::StrCat("position ", b.position, " is outside the context of ",
                                                     o.max_context_tokens, " tokens"));
    int32_t& next = next_pos[b.sequence];
    if (!seen[b.sequence]) {
      seen[b.sequence] = 1;
      if (b.position > next)
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", b.sequence, " position ", b.position, " skips ahead of ", next));
    } else if (b.position != next) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", b.sequence, " positions are not consecutive in the batch"));
    }
    next = b.position + 1;
  }
  return absl::OkStatus();
}

void CudaEngine::Impl::EnqueueExperts(int layer, int n, const DevAct& x_act, int u_begin, int u_count) {
  const ModelConfig& cc = c;
  cuda::ExpertArgs a{};
  a.type = DevTypeOf(expert_type);
  a.arena = arena;
  a.slot_bytes = slot_bytes;
  a.slot_table = slot_table + int64_t(layer) * cc.n_expert;
  a.up_offset = gate_bytes;
  a.down_offset = gate_bytes + up_bytes;
  a.n_embd = cc.n_embd;
  a.n_ff = cc.n_ff_exp;
  a.k = cc.n_expert_used;
  a.n_used = groups.n_used;
  a.used = groups.used;
  a.begin = groups.begin;
  a.pairs = groups.pairs;
  a.u_begin = u_begin;
  a.u_count = u_count;
  const int n_pairs = n * cc.n_expert_used;
  cuda::LaunchExpertGateUp(a, x_act, h, n, stream);
  const DevAct h_act = ActB(ActType(expert_type), cc.n_ff_exp);
  cuda::LaunchQuantize(h, cc.n_ff_exp, n_pairs, cc.n_ff_exp, h_act, stream);
  cuda::LaunchExpertDown(a, h_act, expert_out, n, stream);
}

// The host path of one layer: read its routing (one synchronisation), then run its experts in
// passes of at most n_slots experts each. A pass acquires its missing experts from the source in
// groups of at most max_experts_per_acquire() (a RAM tier smaller than a layer's experts), uploads
// them into LRU victims and launches the expert kernels. The views' memory must outlive the copies
// from it: the last group stays held until the next synchronisation (the next layer's routing
// read, or the end of the step) and an earlier group of the same pass or layer is released after a
// synchronisation of its own, since a source hands out a layer once between releases.
absl::Status CudaEngine::Impl::ServeLayerExperts(int layer, int n, const DevAct& x_act) {
  const int NE = c.n_expert, K = c.n_expert_used;
  CUDA_CHECK(cudaMemcpyAsync(host_groups, groups.n_used, (NE + 2) * 4, cudaMemcpyDeviceToHost, stream));
  if (observer != nullptr)
    CUDA_CHECK(cudaMemcpyAsync(host_chosen, chosen, int64_t(n) * K * 4, cudaMemcpyDeviceToHost, stream));
  Sync();
  ReleaseHeld();  // the previous layer's uploads are complete
  if (observer != nullptr) observer->OnRouting(layer, absl::MakeConstSpan(host_chosen, n * K), K);
  const int n_used = host_groups[0];
  const int32_t* used = host_groups + 2;
  const auto t0 = std::chrono::steady_clock::now();
  const int group_max = std::max(1, source.max_experts_per_acquire());

  absl::Status status;
  for (int u0 = 0; u0 < n_used && status.ok(); u0 += n_slots) {
    const int count = std::min(n_slots, n_used - u0);
    if (u0 > 0) {
      Sync();  // the previous pass read the slots this one may evict, and its copies are done
      ReleaseHeld();
    }
    ++epoch;
    missing.clear();
    for (int u = u0; u < u0 + count; ++u) {
      const int32_t s = host_slot_table[layer * NE + used[u]];
      if (s >= 0) {
        pin_epoch[s] = epoch;
      } else {
        missing.push_back(used[u]);
      }
    }
    int staged = 0;
    bool changed = false;
    for (size_t g0 = 0; g0 < missing.size(); g0 += group_max) {
      if (g0 > 0) {
        if (!jobs.empty()) FlushRepack(&jobs, &staged);
        Sync();  // the copies from the group held are done
        ReleaseHeld();
      }
      const absl::Span<const int32_t> group(missing.data() + g0, std::min<size_t>(group_max, missing.size() - g0));
      status = AcquireGroup(layer, group);
      if (!status.ok()) break;  // a group held is released after Forward's synchronisation
      for (size_t i = 0; i < group.size(); ++i) {
        const int32_t s = TakeVictim();
        CHECK(s >= 0);  // count <= n_slots and only this pass's experts are pinned
        pin_epoch[s] = epoch;
        UploadExpert(layer, group[i], views[i], s, &jobs, &staged);
        ++stats.expert_misses;
        changed = true;
      }
    }
    if (!jobs.empty()) FlushRepack(&jobs, &staged);
    // The device table follows the host's before anything reads it, also after a failure.
    if (changed)
      CUDA_CHECK(cudaMemcpyAsync(slot_table, host_slot_table, total_experts * 4, cudaMemcpyHostToDevice, stream));
    if (!status.ok()) break;
    for (int u = u0; u < u0 + count; ++u) Touch(host_slot_table[layer * NE + used[u]]);
    EnqueueExperts(layer, n, x_act, u0, count);
  }
  stats.upload_seconds_x1e6 += static_cast<int64_t>(
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  return status;
}

absl::Status CudaEngine::Impl::EnqueueLayer(int layer, int n, bool host_path) {
  const DevLayer& L = layers[layer];
  const int64_t E = c.n_embd, QD = c.q_dim(), KD = c.kv_dim();
  const int32_t* d_pos = reinterpret_cast<const int32_t*>(step_input + in.pos);
  const int32_t* d_seq = reinterpret_cast<const int32_t*>(step_input + in.seq);
  const int64_t layer_kv = int64_t(layer) * o.max_sequences * o.max_context_tokens * KD;

  // Attention block.
  const DevAct xa = ActA(ActType(L.wq_type), E);
  cuda::LaunchRmsNorm(x, E, nullptr, n, L.attn_norm, c.rms_norm_eps, E, nullptr, 0, xa, stream);
  const cuda::MatvecOutput qkv[3] = {{L.wq, q, QD, nullptr}, {L.wk, k, KD, nullptr}, {L.wv, v, KD, nullptr}};
  cuda::LaunchMatvec(qkv, 3, xa, n, stream);
  cuda::QkNormRopeArgs r{};
  r.q = q; r.k = k; r.v = v; r.q_norm = L.q_norm; r.k_norm = L.k_norm;
  r.rope_cos = reinterpret_cast<const float*>(step_input + in.rope_cos);
  r.rope_sin = reinterpret_cast<const float*>(step_input + in.rope_sin);
  r.seq = d_seq; r.pos = d_pos;
  r.k_cache = k_cache + layer_kv; r.v_cache = v_cache + layer_kv;
  r.n_head = c.n_head; r.n_head_kv = c.n_head_kv; r.head_dim = c.head_dim; r.max_ctx = o.max_context_tokens;
  r.eps = c.rms_norm_eps;
  cuda::LaunchQkNormRope(r, n, stream);
  cuda::AttentionArgs at{};
  at.q = q; at.k_cache = k_cache + layer_kv; at.v_cache = v_cache + layer_kv; at.seq = d_seq; at.pos = d_pos;
  at.scores = scores; at.out = attn;
  at.n_head = c.n_head; at.n_head_kv = c.n_head_kv; at.head_dim = c.head_dim; at.max_ctx = o.max_context_tokens;
  cuda::LaunchAttention(at, n, stream);
  const DevAct aa = ActA(ActType(L.wo_type), QD);
  cuda::LaunchQuantize(attn, QD, n, QD, aa, stream);
  const cuda::MatvecOutput wo{L.wo, x, E, x};
  cuda::LaunchMatvec(&wo, 1, aa, n, stream);

  // MoE block: norm, router, top-k and grouping on the GPU.
  const DevAct ea = ActA(ActType(expert_type), E);
  cuda::LaunchRmsNorm(x, E, nullptr, n, L.ffn_norm, c.rms_norm_eps, E, xn, E, ea, stream);
  DevAct ra{cuda::kDevF32, E, reinterpret_cast<uint8_t*>(xn), nullptr};
  if (L.router_type != GgmlType::kF32) {
    ra = ActB(ActType(L.router_type), E);
    cuda::LaunchQuantize(xn, E, n, E, ra, stream);
  }
  const cuda::MatvecOutput ro{L.router, router_logits, c.n_expert, nullptr};
  cuda::LaunchMatvec(&ro, 1, ra, n, stream);
  const int32_t* layer_slots = slot_table + int64_t(layer) * c.n_expert;
  cuda::LaunchRouterTopK(router_logits, n, c.n_expert, c.n_expert_used, c.norm_topk_prob, chosen, chosen_w,
                         layer_slots, &groups, stream);
  if (n > 1) cuda::LaunchMoeGroup(chosen, n * c.n_expert_used, c.n_expert, layer_slots, groups, stream);
  if (host_path) {
    RETURN_IF_ERROR(ServeLayerExperts(layer, n, ea));
  } else {
    EnqueueExperts(layer, n, ea, 0, std::min(c.n_expert, n * c.n_expert_used));
  }
  cuda::LaunchMoeCombine(expert_out, chosen_w, n, c.n_expert_used, E, x, stream);
  return absl::OkStatus();
}

// Everything of one step after the input upload, up to the device logits.
void CudaEngine::Impl::EnqueueStep(int n, int n_out, bool host_path, absl::Status* status) {
  const int64_t E = c.n_embd;
  CUDA_CHECK(cudaMemcpyAsync(step_input, host_input, in.bytes, cudaMemcpyHostToDevice, stream));
  cuda::LaunchEmbed(embd_type, embd, embd_row_bytes, reinterpret_cast<const int32_t*>(step_input + in.tokens), n,
                    E, x, stream);
  for (int l = 0; l < c.n_layer; ++l) {
    *status = EnqueueLayer(l, n, host_path);
    if (!status->ok()) return;
  }
  if (n_out == 0) return;
  const DevAct oa = ActA(ActType(output_type), E);
  cuda::LaunchRmsNorm(x, E, reinterpret_cast<const int32_t*>(step_input + in.out_rows), n_out, output_norm,
                      c.rms_norm_eps, E, nullptr, 0, oa, stream);
  const cuda::MatvecOutput lm{output, logits, c.n_vocab, nullptr};
  cuda::LaunchMatvec(&lm, 1, oa, n_out, stream);
}

absl::Status CudaEngine::Forward(absl::Span<const BatchToken> batch, float* logits) {
  Impl& m = *impl_;
  RETURN_IF_ERROR(m.Validate(batch));
  const ModelConfig& c = config_;
  const int n = static_cast<int>(batch.size());
  const int half = c.head_dim / 2;

  // Step inputs: ids, positions, sequences, logits rows and the RoPE table (ggml's rope cache,
  // computed on the host exactly as the CPU engine does).
  int32_t* tokens = reinterpret_cast<int32_t*>(m.host_input + m.in.tokens);
  int32_t* pos = reinterpret_cast<int32_t*>(m.host_input + m.in.pos);
  int32_t* seq = reinterpret_cast<int32_t*>(m.host_input + m.in.seq);
  int32_t* rows = reinterpret_cast<int32_t*>(m.host_input + m.in.out_rows);
  float* rc = reinterpret_cast<float*>(m.host_input + m.in.rope_cos);
  float* rs = reinterpret_cast<float*>(m.host_input + m.in.rope_sin);
  int n_out = 0;
  for (int t = 0; t < n; ++t) {
    tokens[t] = batch[t].token;
    pos[t] = batch[t].position;
    seq[t] = batch[t].sequence;
    if (batch[t].want_logits) rows[n_out++] = t;
    cpu::RopeCache(batch[t].position, c.rope_freq_base, c.head_dim, rc + int64_t(t) * half, rs + int64_t(t) * half);
  }

  const bool host_path = !m.AllResident() || m.observer != nullptr;
  absl::Status status;
  if (!host_path && n == 1 && m.o.use_graphs) {
    cudaGraphExec_t& exec = m.graph[n_out];
    if (exec == nullptr) {
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal));
      m.EnqueueStep(n, n_out, false, &status);
      CUDA_CHECK(cudaStreamEndCapture(m.stream, &graph));
      CHECK(status.ok());  // the device path returns no errors
      CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
    }
    CUDA_CHECK(cudaGraphLaunch(exec, m.stream));
    ++m.stats.graph_launches;
  } else {
    m.EnqueueStep(n, n_out, host_path, &status);
  }
  if (status.ok() && n_out > 0)
    CUDA_CHECK(cudaMemcpyAsync(logits, m.logits, int64_t(n_out) * c.n_vocab * 4, cudaMemcpyDeviceToHost, m.stream));
  m.Sync();
  for (int layer : m.pending_release) m.source.ReleaseLayer(layer);
  m.pending_release.clear();
  ++m.stats.forward_calls;
  m.stats.tokens += n;
  if (!status.ok()) {
    for (const BatchToken& b : batch) m.seq_len[b.sequence] = std::min(m.seq_len[b.sequence], b.position);
    return status;
  }
  for (const BatchToken& b : batch) m.seq_len[b.sequence] = b.position + 1;
  return absl::OkStatus();
}

void CudaEngine::ClearSequence(int sequence) {
  CHECK(sequence >= 0 && sequence < options_.max_sequences);
  impl_->seq_len[sequence] = 0;
}

int32_t CudaEngine::sequence_length(int sequence) const { return impl_->seq_len[sequence]; }

void CudaEngine::set_routing_observer(RoutingObserver* observer) { impl_->observer = observer; }

CudaEngineStats CudaEngine::stats() const {
  Impl& m = *impl_;
  unsigned long long lookups = 0;
  CUDA_CHECK(cudaMemcpy(&lookups, m.lookups_total, 8, cudaMemcpyDeviceToHost));
  m.stats.expert_lookups = static_cast<int64_t>(lookups);
  m.SampleVram();
  return m.stats;
}

}  // namespace mer
