// The cuda backend's engine state and the helpers its translation units share: internal to
// services/compute/cuda (cuda_engine.cc creates the engine and runs the steps;
// host_miss_path.cc is the host's side of misses: the arena's LRU when compute uploads, the
// per-layer acquire of the arena placed by mer-residency, the look-ahead prefetch, Preload).
// Thread-safety: as CudaEngine (one Forward at a time); the miss service (vram_miss_service.h)
// runs on its own thread with state of its own.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/index_list.h"
#include "common/quant/quant.h"
#include "services/compute/cuda/attention.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/cuda_engine.h"
#include "services/compute/cuda/device_buffers.h"
#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/expert_layout.h"
#include "services/compute/cuda/flash_attention.cuh"
#include "services/compute/cuda/matvec.cuh"
#include "services/compute/cuda/moe_experts.cuh"
#include "services/compute/cuda/moe_group.cuh"
#include "services/compute/cuda/rank_layer.cuh"
#include "services/compute/cuda/repack.cuh"
#include "services/compute/cuda/residency_vram.h"
#include "services/compute/cuda/rms_norm.cuh"
#include "services/compute/cuda/router_topk.cuh"
#include "services/compute/cuda/stream_memops.h"
#include "services/compute/cuda/vram_miss_service.h"

namespace mer {
namespace cuda_engine_internal {

inline int64_t AlignUp(int64_t n) { return cuda::DeviceBufferTable::AlignUp(n); }

// The weight types the kernels take, as the refusal message lists them.
inline constexpr char kSupportedTypeNames[] =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, "
    "IQ2_S, IQ3_XXS, IQ3_S, IQ1_S";

using cuda::NeedsRepack;

inline bool SupportedType(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16 || NeedsRepack(t);
}

inline int DevTypeOf(GgmlType t) { return static_cast<int>(t); }  // DevType mirrors GgmlType's numbers

inline int ActType(GgmlType weight_type) { return DevTypeOf(ActivationTypeFor(weight_type)); }

inline int64_t MatrixBytes(const MatrixView& m) { return m.rows * m.row_bytes(); }

// One cudaMalloc laid out by a DeviceBufferTable: every buffer of a kind is declared once, then
// the allocation binds them all.
class DeviceAllocation {
 public:
  absl::Status Allocate(const cuda::DeviceBufferTable& table, const char* what) {
    size_ = table.bytes();
    if (size_ == 0) return absl::OkStatus();
    const cudaError_t e = cudaMalloc(&base_, size_);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      base_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of ", size_, " bytes for ", what, " failed: ", cudaGetErrorString(e)));
    }
    table.Bind(static_cast<uint8_t*>(base_));
    return absl::OkStatus();
  }
  int64_t size() const { return size_; }
  void Free() {
    if (base_ != nullptr) CUDA_CHECK(cudaFree(base_));
    base_ = nullptr;
  }

 private:
  void* base_ = nullptr;
  int64_t size_ = 0;
};

struct DevLayer {
  const float* attn_norm;  // f32 [n_embd]
  const float* q_norm;     // f32 [head_dim]
  const float* k_norm;     // f32 [head_dim]
  const float* ffn_norm;   // f32 [n_embd]
  cuda::DevMatrix wq, wk, wv, wo, router;
  GgmlType wq_type, wk_type, wv_type, wo_type, router_type;
};

// Host-pinned step inputs, copied to the device in one transfer per step.
struct StepInputLayout {
  int64_t tokens, pos, seq, out_rows, rope_cos, rope_sin, step, bytes;  // byte offsets
};

}  // namespace cuda_engine_internal

struct CudaEngine::Impl {
  using DevAct = cuda::DevAct;
  using DevMatrix = cuda::DevMatrix;
  using DeviceAllocation = cuda_engine_internal::DeviceAllocation;
  using ExpertLayout = cuda::ExpertLayout;
  using DevLayer = cuda_engine_internal::DevLayer;
  using StepInputLayout = cuda_engine_internal::StepInputLayout;

  Impl(const ModelWeights& w, ExpertSource& s) : weights(w), source(s), c(w.config()) {}
  ~Impl();

  const ModelWeights& weights;
  ExpertSource& source;
  const ModelConfig c;
  CudaEngineOptions o;
  RoutingObserver* observer = nullptr;
  cudaStream_t stream = nullptr;

  // Preselected routes (backend.h's RouteOverride; null: off). Run asks for every layer's routes
  // before it enqueues anything (TakeRoutes), into pinned memory with a region per layer, so the
  // step's copies of layer l's routes read them from there while later layers are enqueued, and
  // a bad route fails the step before it starts. Allocated by set_route_override on first use
  // (qualification and replay, not serving).
  enum class Given : uint8_t { kRouter, kIds, kIdsAndWeights };
  RouteOverride* route = nullptr;
  int32_t* route_ids = nullptr;    // pinned int32 [n_layer, T, K]
  float* route_weights = nullptr;  // pinned f32 [n_layer, T, K]
  std::vector<Given> route_given;  // [n_layer], this step's
  bool routes_this_step = false;   // some layer of the step being enqueued has a given route

  DeviceAllocation dense_pool, work_pool, arena_pool;

  // Dense weights.
  int embd_type = 0;
  const uint8_t* embd = nullptr;  // GGUF layout [n_vocab, n_embd]
  int64_t embd_row_bytes = 0;
  DevMatrix output;  // [n_vocab, n_embd]
  GgmlType output_type = GgmlType::kF32;
  const float* output_norm = nullptr;
  std::vector<DevLayer> layers;

  // Experts: per layer, types and where gate, up and down lie in a slot.
  std::vector<ExpertLayout> expert_layout;

  // KV cache, f32 [layer][sequence][position][kv_dim].
  float* k_cache = nullptr;
  float* v_cache = nullptr;

  // Workspaces for T = max_batch_tokens tokens (K = top-k, W = widest activation row).
  float* x = nullptr;              // f32 [T, n_embd] residual stream
  float* xn = nullptr;             // f32 [T, n_embd]
  float* q = nullptr;              // f32 [T, q_dim]
  float* k = nullptr;              // f32 [T, kv_dim]
  float* v = nullptr;              // f32 [T, kv_dim]
  float* attn = nullptr;           // f32 [T, q_dim]
  float* scores = nullptr;         // f32 [T * n_head, AttentionScoresStride(max_ctx)]
  float* router_logits = nullptr;  // f32 [T, n_expert]
  int32_t* chosen = nullptr;       // int32 [T, K]
  float* chosen_w = nullptr;       // f32 [T, K]
  float* h = nullptr;              // f32 [T * K, n_ff]
  float* expert_out = nullptr;     // f32 [T * K, n_embd]
  float* logits = nullptr;         // f32 [T, n_vocab]
  int32_t* argmax_ids = nullptr;   // int32 [T], ForwardArgmax's
  void* argmax_scratch = nullptr;  // cuda::ArgmaxScratchBytes(T), zeroed at Create
  uint8_t* act_a = nullptr;        // activations [T, max(n_embd, q_dim)] (+ scales)
  float* act_a_scales = nullptr;
  uint8_t* act_b = nullptr;  // activations [max(T * K * n_ff, T * n_embd)] (+ scales)
  float* act_b_scales = nullptr;
  // Up's activations [T, n_embd] (+ scales) where a layer's up reads another activation type than
  // its gate (ExpertInput); not allocated for models without such a layer.
  uint8_t* act_up = nullptr;
  float* act_up_scales = nullptr;
  cuda::MoeGroups groups{};
  unsigned long long* lookups_total = nullptr;
  unsigned int* router_blocks_done = nullptr;  // LaunchRouterTopK1's counter
  uint8_t* step_input = nullptr;               // StepInputLayout
  uint8_t* staging = nullptr;                  // raw GGUF expert bytes [staging_experts, slot_bytes]
  uint8_t* prefetch_staging = nullptr;         // the same, for the look-ahead prefetch's copy stream
  int32_t* slot_table = nullptr;               // int32 [n_layer, n_expert] -> slot or -1
  StepInputLayout in{};

  // Pinned host mirrors.
  uint8_t* host_input = nullptr;               // StepInputLayout
  int32_t* host_slot_table = nullptr;          // [n_layer * n_expert], authoritative; uploaded after changes
  int32_t* host_groups = nullptr;              // n_used, then used[n_expert]
  int32_t* host_chosen = nullptr;              // [T * K], for the routing observer
  unsigned long long* host_lookups = nullptr;  // lookups_total, copied back with every step's logits
  int32_t* host_table_upload = nullptr;        // snapshot of host_slot_table that an async upload reads

  // Look-ahead prefetch into VRAM (decode steps on the host path): layer l + 1's router applied to
  // layer l's normed hidden state (the input of layer l's own router, in the same launch) predicts
  // l + 1's experts; the missing ones are uploaded on copy_stream while layer l's experts and
  // l + 1's attention run. The main stream waits for them (prefetch_done) before it uploads into or
  // reads any slot of l + 1.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t prefetch_done = nullptr;
  float* pred_logits = nullptr;     // f32 [n_expert]
  int32_t* pred_chosen = nullptr;   // int32 [K]
  float* pred_w = nullptr;          // f32 [K]
  cuda::MoeGroups pred_groups{};    // its own arrays and lookup counter (predictions are not lookups)
  int32_t* host_pred = nullptr;     // pinned [K]
  int prefetch_layer = -1;          // the layer whose prefetch was issued and not yet consumed
  int prefetch_held_layer = -1;     // the layer the source holds for a prefetch's copies, or -1
  std::vector<int32_t> prefetched;  // its experts
  bool table_dirty = false;         // host_slot_table changed since the last upload

  // Arena bookkeeping (host side).
  uint8_t* arena = nullptr;
  int64_t slot_bytes = 0;
  int32_t n_slots = 0;
  std::vector<int32_t> owner;  // [n_slots] key layer * n_expert + e, or -1
  struct LruNode {
    uint32_t prev = kNilIndex;
    uint32_t next = kNilIndex;
  };
  std::vector<LruNode> lru_nodes;   // [n_slots]
  IndexList<LruNode> lru;           // every slot; front = most recently used
  std::vector<uint64_t> pin_epoch;  // [n_slots]: == epoch while the current pass uses it
  uint64_t epoch = 0;
  int64_t resident = 0;
  int64_t total_experts = 0;  // n_layer * n_expert: the slot table's entries
  // The experts this engine holds when its arena has all it runs: total_experts, or on an
  // expert-parallel rank its share (every layer's o.placement->OwnedExperts).
  int64_t held_experts = 0;
  void* pinned_base = nullptr;  // cudaHostRegister'ed range of the experts' host memory

  // Sequences.
  std::vector<int32_t> seq_len, next_pos;
  std::vector<uint8_t> seen;
  std::vector<int32_t> out_rows;
  // The layer acquired from the source whose uploads may still be in flight (at most one): it is
  // released after the next synchronisation (ReleaseHeld).
  std::vector<int> pending_release;
  // ServeLayerExperts' and Preload's lists, reserved at Create.
  std::vector<int32_t> missing;            // experts of a pass not in the arena
  std::vector<ExpertWeights> views;        // of the group acquired
  std::vector<cuda::TypedRepackJob> jobs;  // repack jobs not launched yet

  // With o.vram_residency: the arena is exported to mer-residency, which fills it (docs/cuda.md,
  // "The arena over CUDA IPC"); the LRU above is unused then.
  std::unique_ptr<cuda::ResidencyVram> residency_vram;

  // Misses decided on the device (docs/cuda.md): with the arena over CUDA IPC, every layer's
  // routing is posted as a record and the step waits on the device at the layer's gate, which
  // the device opens itself when nothing misses and the miss service once it has placed what did.
  bool device_misses = false;
  bool device_graphs = false;                 // steps with gate waits capture into graphs
  uint32_t* gates = nullptr;                  // device [n_layer]: 1 = the layer may go on
  unsigned long long* record_head = nullptr;  // device: routing records posted
  uint8_t* record_ring = nullptr;             // host-mapped [ring_capacity, record_bytes]
  uint8_t* record_ring_device = nullptr;      // its device address
  int32_t ring_capacity = 0, record_bytes = 0;
  uint32_t step_number = 0;  // the last step's (a step input), from 1
  std::unique_ptr<cuda::VramMissService> miss_service;
  // The stream waits until the layer's gate is open, then closes it for the next step.
  void WaitGate(int layer) {
    CHECK(cuda::StreamWaitEqual(stream, gates + layer, 1));
    CHECK(cuda::StreamWrite(stream, gates + layer, 0));
  }

  // CUDA graphs of a single-token step on the device path (every expert resident, or misses
  // decided on the device with device_graphs), by number of logits rows (0 or 1), whether attention
  // runs split-K (attention_split) and whether the step ends in the argmax kernel (ForwardArgmax).
  cudaGraphExec_t graph[2][2][2] = {};
  // DecodeGreedy's pipeline: two sets of pinned inputs and ids, so that the host fills step
  // i + 1's while step i runs, each step ending in an event; its graphs by set, by where the
  // step's token comes from (the host for the first step, the previous step's argmax_ids on the
  // device after it) and by attention_split.
  uint8_t* pipe_input[2] = {};
  int32_t* pipe_ids = nullptr;  // pinned [2]
  cudaEvent_t pipe_done[2] = {};
  cudaGraphExec_t pipe_graph[2][2][2] = {};
  // This step's attention is split-K: its longest context passes o.attention_split_min_cells.
  bool attention_split = false;
  // This step's attention runs on the tensor cores (AttentionFlashFor); attention_split is then false.
  bool attention_flash = false;

  BackendCounters stats;

  // Expert parallelism (o.placement; CudaEngineOptions says what is built): each MoE layer starts
  // by zeroing expert_out and counting this rank's work (LaunchRankLayerStart), and its expert
  // outputs are summed over the ranks after its expert kernels (ExchangeExperts).
  cuda::RankCounts* rank_counts = nullptr;       // device, accumulated over the steps
  uint8_t* held = nullptr;                       // device [n_layer, n_expert]: 1 for this rank's experts
  cuda::RankCounts* host_rank_counts = nullptr;  // pinned: copied back at the end of each step
  float* host_expert_out = nullptr;              // pinned f32 [T * K, n_embd]: the host exchange's buffer
  double exchange_us = 0;                        // the host exchange's time (stats has it rounded)
  // The device exchange's generation the graphs were captured under (DropStaleGraphs).
  uint64_t graphs_generation = 0;
  // The rank's side of the exchange, after the layer's expert kernels were enqueued.
  absl::Status ExchangeExperts(int n);
  // Whether this engine runs `expert` of `layer`: every expert, or this rank's.
  bool Runs(int layer, int expert) const { return o.placement == nullptr || o.placement->Holds(layer, expert); }
  // Destroys the captured graphs when the device exchange has made new communicators since they
  // were captured (a graph keeps the communicator it was captured with).
  void DropStaleGraphs();
  // Copies the rank's counters back with the step's outputs (pinned: read after the step's sync).
  void CopyRankCounts() {
    if (o.placement != nullptr)
      CUDA_CHECK(
          cudaMemcpyAsync(host_rank_counts, rank_counts, sizeof(cuda::RankCounts), cudaMemcpyDeviceToHost, stream));
  }
  // After the step's sync: the lookups (and, on a rank, the pairs) counted on the device.
  void TakeDeviceCounts() {
    if (o.placement == nullptr) {
      stats.expert_lookups = static_cast<int64_t>(*host_lookups);
      return;
    }
    stats.expert_lookups = static_cast<int64_t>(host_rank_counts->lookups);
    stats.expert_pairs = static_cast<int64_t>(host_rank_counts->pairs);
    stats.busiest_rank_pairs = static_cast<int64_t>(host_rank_counts->busiest_rank_pairs);
  }

  // Kernel profile (o.profile_kernels): an event after each launch of a step, and per name the
  // GPU time from the previous event, summed over steps. Graphs are off while it is on.
  std::vector<std::pair<const char*, cudaEvent_t>> marks;
  std::vector<cudaEvent_t> event_pool;
  std::map<std::string, std::pair<double, int64_t>> kernel_ms[2];  // [n == 1], name -> (ms, launches)
  bool step_is_decode = false;
  void Mark(const char* name) {
    if (!o.profile_kernels) return;
    if (marks.size() == event_pool.size()) {
      cudaEvent_t e;
      CUDA_CHECK(cudaEventCreate(&e));
      event_pool.push_back(e);
    }
    cudaEvent_t e = event_pool[marks.size()];
    CUDA_CHECK(cudaEventRecord(e, stream));
    marks.push_back({name, e});
  }
  // After the step's final synchronisation.
  void CollectMarks() {
    for (size_t i = 1; i < marks.size(); ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
      auto& slot = kernel_ms[step_is_decode][marks[i].first];
      slot.first += ms;
      ++slot.second;
    }
    marks.clear();
  }

  absl::Status Validate(absl::Span<const BatchToken> batch);
  // Writes the batch's step inputs into host memory `dst` (StepInputLayout); returns the number
  // of logits rows, and the largest position into *max_position.
  int FillInput(absl::Span<const BatchToken> batch, uint8_t* dst, int32_t* max_position);
  // The step's launches from the input copy of `input` (host, StepInputLayout), ending with the LM
  // head for n_out rows and, with argmax, their argmaxes into argmax_ids (ForwardArgmax). With
  // device_tokens the embedding reads the step's tokens there instead of from the input. A graph
  // captures it whole.
  void EnqueueStep(int n, int n_out, bool host_path_allowed, bool argmax, absl::Status* status, const uint8_t* input,
                   const int32_t* device_tokens = nullptr);
  // Captures what `enqueue` puts on the stream (the device path, which returns no errors) into *exec.
  void CaptureGraph(cudaGraphExec_t* exec, const std::function<void(absl::Status*)>& enqueue);
  absl::Status EnqueueLayer(int layer, int n, bool host_path);
  // Asks the RouteOverride for every layer's routes of an n-token step and checks them
  // (InvalidArgument, before anything is enqueued); whether any layer has one.
  absl::StatusOr<bool> TakeRoutes(int n);
  // The layer's given routes into chosen and chosen_w, and its groups, after the router's launches.
  void EnqueueGivenRoute(int layer, int n);
  // A layer's expert input rows: in gate's activation type, and in up's (the same rows where the
  // two activation types are equal; act_up where they differ).
  struct ExpertInput {
    DevAct gate, up;
  };
  absl::Status ServeLayerExperts(int layer, int n, const ExpertInput& x_act);
  absl::Status ServeFromResidency(int layer, int n, const ExpertInput& x_act, const int32_t* used, int n_used,
                                  bool predicted);
  bool Predicts(int layer, int n, bool host_path) const;
  void PrefetchLayer(int layer);
  void UploadSlotTable();
  void EnqueueExperts(int layer, int n, const ExpertInput& x_act, int u_begin, int u_count);
  // Uploads through staging_base on stream s (the main stream and `staging`, or the prefetch's).
  void UploadExpert(int layer, int expert, const ExpertWeights& w, int32_t slot,
                    std::vector<cuda::TypedRepackJob>* jobs, int* staged, cudaStream_t s, uint8_t* staging_base);
  void FlushRepack(std::vector<cuda::TypedRepackJob>* jobs, int* staged, cudaStream_t s);
  void RmsNormAct(const int32_t* rows, int n_rows, const cuda::MoeCombine& combine, const float* w, float* y,
                  const DevAct& act);
  int32_t TakeVictim();
  void Touch(int32_t slot);
  // The MoE output of the layer before `layer` (none before layer 0), for the norm that adds it.
  cuda::MoeCombine PreviousMoe(int layer) const {
    if (layer == 0) return {};
    return {expert_out, chosen_w, c.n_expert_used};
  }
  // Releases the prefetch's hold on the source; unless the main stream has synchronised since it
  // waited for the prefetch's copies, waits for them first (a host synchronisation).
  void ReleasePrefetchHold(bool copies_done) {
    if (prefetch_held_layer < 0) return;
    if (!copies_done) {
      CUDA_CHECK(cudaEventSynchronize(prefetch_done));
      ++stats.host_syncs;
    }
    source.ReleaseLayer(prefetch_held_layer);
    prefetch_held_layer = -1;
  }
  // Releases the layer held from the source and the pass's VRAM pins; call after a
  // synchronisation saw the copies and kernels that use them complete.
  void ReleaseHeld() {
    for (int layer : pending_release) source.ReleaseLayer(layer);
    pending_release.clear();
    if (residency_vram != nullptr) residency_vram->Release();  // VRAM pins, after the same sync
  }
  // FailedPrecondition unless the source's view of (layer, expert) has the arena's types and shapes.
  absl::Status CheckView(int layer, int expert, const ExpertWeights& w) const;
  // Acquires group of `layer` into views (and holds it, pending_release), checked.
  absl::Status AcquireGroup(int layer, absl::Span<const int32_t> group);
  void Sync() {
    CUDA_CHECK(cudaStreamSynchronize(stream));
    ++stats.host_syncs;
  }
  // On the device miss path the step's stream waits at gates that the miss service opens from
  // its own thread, with CUDA calls of its own. The stepping thread then waits for the step by
  // polling an event, outside the driver, rather than blocking in a CUDA call (a stream or event
  // synchronisation, a copy into pageable memory) for as long as the misses take.
  void WaitEvent(cudaEvent_t event) {
    if (!device_misses) {
      CUDA_CHECK(cudaEventSynchronize(event));
      return;
    }
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaEventQuery(event);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) CUDA_CHECK(e);
      if (spins < 4000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }
  // Everything enqueued on `stream` so far has completed (one host synchronisation).
  void WaitStepDone() {
    CUDA_CHECK(cudaEventRecord(step_done, stream));
    WaitEvent(step_done);
    ++stats.host_syncs;
  }
  cudaEvent_t step_done = nullptr;
  // The device miss path, steps enqueued launch by launch (not as a graph): the driver's launch
  // queue is finite, a launch into a full one blocks inside the driver, and a step waiting at a
  // gate drains nothing while the miss service needs the driver to open it. So the stepping
  // thread enqueues at most kEnqueueLayersAhead layers past the last one whose routing record the
  // device has posted. records_posted: the records that the work launched so far posts.
  static constexpr int kEnqueueLayersAhead = 6;
  uint64_t records_posted = 0;
  bool capturing = false;  // in CaptureGraph: nothing runs, nothing is waited for
  // Makes the engine's device current on the calling thread (every public call begins so).
  void MakeCurrent() const { CUDA_CHECK(cudaSetDevice(o.device)); }
  void SampleVram() {
    size_t free_b = 0, total_b = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    stats.vram_total_bytes = static_cast<int64_t>(total_b);
    stats.vram_used_bytes = static_cast<int64_t>(total_b - free_b);
    stats.vram_used_peak_bytes = std::max(stats.vram_used_peak_bytes, stats.vram_used_bytes);
  }
  DevAct ActA(int type, int64_t stride) const { return DevAct{type, stride, act_a, act_a_scales}; }
  DevAct ActB(int type, int64_t stride) const { return DevAct{type, stride, act_b, act_b_scales}; }
  bool AllResident() const { return resident == held_experts; }
  // Whether a step whose largest position is max_position runs split-K attention.
  bool AttentionSplitAt(int32_t max_position) const {
    return o.attention_split_min_cells > 0 && max_position + 1 > o.attention_split_min_cells &&
           cuda::AttentionSplitSupported(c.head_dim, o.max_context_tokens);
  }
  // Whether a step runs the tensor-core attention: more than one token, and a run of at least
  // o.attention_flash_min_tokens consecutive tokens of one sequence.
  bool AttentionFlashFor(absl::Span<const BatchToken> batch) const {
    if (o.attention_flash_min_tokens <= 0 || batch.size() < 2 || !cuda::FlashAttentionSupported(c.head_dim))
      return false;
    int run = 0, longest = 0;
    for (size_t t = 0; t < batch.size(); ++t) {
      run = t > 0 && batch[t].sequence == batch[t - 1].sequence ? run + 1 : 1;
      longest = std::max(longest, run);
    }
    return longest >= o.attention_flash_min_tokens;
  }
};

}  // namespace mer
