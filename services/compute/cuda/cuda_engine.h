// The cuda backend of mer-compute: the qwen3moe forward pass on one NVIDIA GPU (built for Hopper,
// sm_90a), with the same semantics as CpuEngine (services/compute/cpu/cpu_engine.h): batches that
// mix sequences and positions, a KV cache per sequence slot, logits copied to the host only for
// the tokens that want them.
//
// Memory (all reserved at Create, nothing allocated by Forward): the dense weights (uploaded at
// Create), the f32 KV cache, the workspaces for max_batch_tokens tokens, and the expert arena: a
// pool of equal VRAM slots, one expert (gate | up | down) each, sized from what is left (free
// memory minus a margin) and capped by the options; a device-side slot table maps (layer, expert)
// to a slot and is what the expert kernels read. The weights may lack the expert tensors (an
// expert store's dense.gguf): the experts' types then come from the source
// (ExpertSource::expert_types, a store's manifest).
//
// An arena that holds every expert is filled at Create (Preload, from the ExpertSource) and never
// exported: every step runs on the device, single-token steps as CUDA graphs. A partial arena is
// served one of three ways (docs/cuda.md, "VRAM budget and the arena"):
//   - vram_residency null: the host reads each layer's routing (one synchronisation) and uploads
//     the misses from the host pointers the ExpertSource returns (cudaMemcpyAsync; the host memory
//     pinned with cudaHostRegister when it can be), evicting the least recently used expert the
//     layer being computed does not use; a layer's misses are acquired in groups of at most the
//     source's max_experts_per_acquire(), each held until its copies are complete;
//   - vram_residency set: the arena is exported to mer-residency, which places the experts; the
//     host reads each layer's routing and acquires the layer's experts from it;
//   - vram_residency set and device_misses: the device decides each layer's hits and misses and
//     waits for the misses at a gate that the miss service opens (vram_miss_service.h).
//
// An engine may be one rank of an expert-parallel group (CudaEngineOptions::placement), on a GPU
// of its own or sharing one with other ranks.
//
// This header exposes no CUDA types (the implementation's are behind Impl).
// Thread-safety: one Forward at a time; Create, ClearSequence and stats likewise. Each call makes
// the engine's device current on the calling thread, so that the ranks of a group, each driven
// by a thread of its own, may sit on different GPUs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/expert_source.h"
#include "common/model/model_weights.h"
#include "services/compute/backend.h"
#include "services/compute/cuda/device_exchange.h"
#include "services/compute/cuda/published_experts.h"
#include "services/compute/expert_parallel.h"
#include "services/compute/vram_residency.h"

namespace mer {

struct CudaEngineOptions {
  int device = 0;                 // CUDA device ordinal
  int max_batch_tokens = 256;     // tokens per Forward call (prompt chunk size), >= 1
  int max_sequences = 1;          // KV cache slots
  int max_context_tokens = 4096;  // KV positions per sequence; capped at the model's context_length
  // Caps on the expert arena (the smaller applies); negative: no cap. The arena never exceeds all
  // of the model's experts, nor the free VRAM less vram_margin_bytes.
  int64_t vram_expert_budget_bytes = -1;
  double vram_expert_budget_fraction = -1;       // of all n_layer * n_expert experts, in (0, 1]
  int64_t vram_margin_bytes = int64_t{1} << 30;  // left free for the driver and libraries
  // cudaHostRegister the experts' host memory when it is the mapped model file (other sources pin
  // their own memory: ResidencyExpertSourceOptions::pin_ram_tier with CudaRegisterHostMemory).
  bool pin_host_experts = true;
  bool use_graphs = true;    // CUDA graphs for single-token steps on the device path
  int staging_experts = 16;  // device staging buffers for uploads (experts per repack launch)
  // Look-ahead prefetch into VRAM on decode steps that miss: the next layer's router applied to
  // the current hidden state picks experts to upload while this layer computes.
  bool vram_prefetch = true;
  // Time every kernel of every step with CUDA events (no graphs; for KernelProfile).
  bool profile_kernels = false;
  // Attention runs split-K in steps whose longest context passes this many cells (attention.cuh);
  // 0: never. Split-K is not bit-exact with the CPU (its softmax sums are regrouped): with F32
  // weights the engine's logits stay within 3.2e-7 (relative L2) of the CPU's on a 1,200-token
  // prompt, with Q8_0 they drift 1e-2 to 1e-1 apart, since an activation within an ulp of a Q8_0
  // rounding step flips to the next int8 and that grows through the layers (cuda_engine_test
  // LongContextSplitKCloseToCpu). But the exact kernel, a block per token and head, slows down
  // with the context: on the H200 (30B geometry, Q8_0) decode at 600 / 1,000 / 8,000 positions
  // is 184.7 / 150.0 / 35.6 tokens/s exact and 210.4 / 215.4 / 123.8 split; at 300 they are even
  // (219.5 / 215.6). Hence 512: contexts up to 512 cells (the corpus, the benchmark's 159) stay
  // bit-exact; 0 keeps every length so.
  int attention_split_min_cells = 512;
  // Steps with a run of at least this many consecutive batch tokens of one sequence (a prompt
  // chunk) and more than one token run attention on the tensor cores (flash_attention.cuh)
  // instead of the exact or split-K kernel; 0: never. Not bit-exact with the CPU (f16 inputs,
  // within 5e-3 relative L2 of the exact kernel), so decode steps, which never take it, and
  // short prompts keep the exact kernel's bits.
  int attention_flash_min_tokens = 64;
  // Non-null: a partial arena is exported to mer-residency through CUDA IPC and filled by it (the
  // experts come through this, not the ExpertSource; docs/cuda.md, "The arena over CUDA IPC"); an
  // arena that holds every expert is filled from the ExpertSource at Create and not exported.
  // Not owned; outlives the engine. Null: the engine uploads from the ExpertSource itself.
  VramResidency* vram_residency = nullptr;
  // With vram_residency: the device decides each layer's hits and misses and waits for the misses
  // on the device (a miss service thread has mer-residency place them), so no host thread blocks
  // between layers and steps run as graphs (docs/cuda.md, "Misses decided on the device"). Needs
  // an arena of at least n_expert + 2 * top-k slots and stream memory operations; otherwise, or
  // false, the host reads each layer's routing and serves its misses. mer-compute turns it on
  // unless --miss-path host.
  bool device_misses = false;
  // With device_misses: which published experts make room for a layer's misses (published_experts.h).
  cuda::ArenaPolicy arena_policy = cuda::ArenaPolicy::kLfu;
  // Expert parallelism (expert_parallel.h; docs/cuda.md, "Expert-parallel ranks"), not owned: this
  // engine is one rank of a group. Its arena holds only its share, the experts e mod n_ranks ==
  // rank of every layer, and must hold all of it (the budget caps the share; no misses, so neither
  // vram_residency nor device_misses); each MoE layer's expert kernels run only the pairs of its
  // experts into outputs zeroed first, and the ranks sum those outputs through one of two
  // exchanges, given with the placement and not both:
  //   - device_exchange (NCCL, ranks on distinct GPUs): the sum is enqueued on the step's stream,
  //     so single-token steps still run as CUDA graphs;
  //   - host_exchange (ranks that share a GPU, which NCCL refuses): each layer's outputs are copied
  //     to the host, summed there (ExpertExchange::SumAcrossRanks) and copied back, a
  //     synchronisation per layer, and the steps run without graphs, as the host miss path's do.
  // Replicated experts (placement->replicas() > 0) are not built: a step with any fails. Every
  // rank must be given the same calls (Forward, ForwardArgmax, ClearSequence) in the same order.
  const ExpertPlacement* placement = nullptr;
  DeviceExpertExchange* device_exchange = nullptr;
  ExpertExchange* host_exchange = nullptr;
};

class CudaEngine final : public ComputeBackend {
 public:
  // False when no CUDA device is usable (no driver, no GPU): callers fall back or skip.
  static bool DeviceAvailable();
  // The CUDA devices this process sees (0 without a driver).
  static int DeviceCount();

  static absl::StatusOr<std::unique_ptr<CudaEngine>> Create(const ModelWeights& weights, ExpertSource& experts,
                                                            const CudaEngineOptions& options);
  ~CudaEngine();

  const CudaEngineOptions& options() const { return options_; }
  // The VRAM breakdown logged at Create: device, dense, KV, workspace, margin, arena.
  const std::string& budget_report() const { return budget_report_; }
  // Loads every expert the arena can hold (layer-major), so benchmarks start warm; returns how many.
  absl::StatusOr<int64_t> Preload();

  // ComputeBackend.
  const ModelConfig& config() const override { return config_; }
  int max_batch_tokens() const override { return options_.max_batch_tokens; }
  int max_sequences() const override { return options_.max_sequences; }
  int max_context_tokens() const override { return options_.max_context_tokens; }
  absl::Status Forward(absl::Span<const BatchToken> batch, float* logits) override;
  // The argmax of each row on the GPU (argmax.cuh); 4 bytes per row to the host.
  absl::Status ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) override;
  // With every expert resident (one graph per step) the steps are pipelined: step i + 1 is
  // launched, its token read on the device from step i's argmax, before the host waits for step i
  // (docs/cuda.md, "The step"). Otherwise ForwardArgmax's loop.
  absl::Status DecodeGreedy(int sequence, int32_t token, int32_t position, int max_steps,
                            const std::function<bool(int32_t)>& on_token) override;
  void ClearSequence(int sequence) override;
  int32_t sequence_length(int sequence) const override;
  void set_routing_observer(RoutingObserver* observer) override;
  // Preselected routes: each step asks for every layer's routes before it launches anything (an
  // invalid one fails the step with nothing run) and copies them to the device after the layer's
  // router, no host synchronisation added; a step with routes runs launch by launch (no graph:
  // one would replay the router's choice), and DecodeGreedy is not pipelined while an override
  // is set. ResourceExhausted when the pinned memory for the routes cannot be had.
  absl::Status set_route_override(RouteOverride* route) override;
  // Every field; arena_resident and the VRAM use sampled now.
  BackendCounters counters() const override;
  // With options.profile_kernels: GPU time per kernel kind, decode and multi-token steps apart.
  std::string KernelProfile() const override;

 private:
  // Forward with either output: logits (n_vocab floats per row) or ids (the rows' argmaxes).
  absl::Status Run(absl::Span<const BatchToken> batch, float* logits, int32_t* ids);
  // DecodeGreedy's pipeline: step i at position + i launched (a graph), its id read once it is done.
  absl::Status DecodePipelined(int sequence, int32_t token, int32_t position, int max_steps,
                               const std::function<bool(int32_t)>& on_token);
  struct Impl;
  CudaEngine(const ModelConfig& config, const CudaEngineOptions& options, std::unique_ptr<Impl> impl);

  const ModelConfig config_;
  CudaEngineOptions options_;
  std::string budget_report_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mer
