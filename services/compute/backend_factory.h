// Creating a compute backend by name: the one place that knows which backends this build has
// (`cpu` always, `cuda` when built with MER_CUDA) and turns the shared engine settings into each
// backend's options. Used by mer-compute and by the `mer` command line; everything else sees
// only ComputeBackend (its counters and kernel profile included).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/expert_source.h"
#include "common/model/model_weights.h"
#include "services/compute/backend.h"
#include "services/compute/vram_residency.h"

namespace mer {

struct BackendOptions {
  std::string backend = "cpu";    // "cpu" or "cuda"
  int threads = 0;                // cpu: worker threads including the caller; 0 = all cores
  int max_batch_tokens = 256;     // tokens per Forward (prompt chunk size)
  int max_sequences = 1;          // KV cache slots
  int max_context_tokens = 4096;  // KV positions per sequence (capped at the model's)
  // cuda: cap on the VRAM expert arena, "BYTES" or "PERCENT%" of all experts; empty: no cap
  // beyond the free VRAM.
  std::string vram_expert_budget;
  // cuda: page-lock the host memory experts are uploaded from (the mapped file at Create; a
  // RAM tier through HostMemoryPinnerFor).
  bool pin_host_experts = true;
  bool vram_prefetch = true;     // cuda: look-ahead prefetch into VRAM on decode misses
  bool profile_kernels = false;  // cuda: time every kernel (ComputeBackend::KernelProfile)
  // cuda: CudaEngineOptions::attention_split_min_cells; unset: the engine's default.
  std::optional<int> attention_split_min_cells;
  // cuda: CudaEngineOptions::attention_flash_min_tokens; unset: the engine's default.
  std::optional<int> attention_flash_min_tokens;
  // cuda: export the arena to mer-residency over CUDA IPC (it fills it); null: upload here.
  VramResidency* vram_residency = nullptr;
  // cuda with vram_residency: the device decides each layer's hits and misses (CudaEngineOptions::
  // device_misses); false: the host reads each layer's routing and serves its misses.
  bool device_misses = false;
  // cuda with device_misses: "lfu" or "lru", the order in which published experts make room for a
  // layer's misses (cuda/published_experts.h).
  std::string arena_policy = "lfu";
  // cuda: which kernels take multi-token Q8_0 products: "auto", "dp4a", "exact" or "fast"
  // (cuda::MultiTokenQ8_0: a setting of the whole process); empty: MER_CUDA_MMA's, else auto.
  std::string multi_token_kernels;
  // Expert-parallel ranks (expert_parallel_backend.h): each computes the dense part and the experts
  // e with e mod expert_ranks == its rank. cpu: `threads` split between them. cuda: a CudaEngine
  // per rank, rank r on GPU gpus[r], each with its share of the experts preloaded into its arena
  // (all of it must fit: CudaEngineOptions::placement); ranks on distinct GPUs sum their experts'
  // outputs through NCCL, ranks that share a GPU on the host. Rank 0 reads `experts`, rank r > 0
  // rank_experts(r): an ExpertSource serves one engine.
  int expert_ranks = 1;  // 1 to kMaxExpertRanks
  // cuda: the GPU of each rank (CUDA ordinals, expert_ranks of them; one for a single engine); a GPU
  // may repeat (ranks that share it). Empty: GPUs 0 .. expert_ranks - 1.
  std::vector<int> gpus;
  // With expert ranks: each layer's this many most used experts replicated on every rank, chosen
  // again every 64 calls from the routing served (HotExpertReplication); 0: none. cpu only (the
  // cuda ranks' arenas hold their shares only).
  int replicate_hot_experts = 0;
  std::function<absl::StatusOr<std::unique_ptr<ExpertSource>>(int rank)> rank_experts;
};

inline constexpr int kMaxExpertRanks = 64;

struct CreatedBackend {
  std::unique_ptr<ComputeBackend> engine;
  int threads = 0;  // CPU threads the backend computes on (the cpu backend's pool; 1 for cuda)
};

// The prompt chunk (tokens per Forward) a backend takes by default: its prompt tokens/s rises with
// the chunk on cuda (on the H200, Qwen3-30B-A3B geometry Q8_0, a 2,048-token prompt: 4,428 tokens/s
// in chunks of 256, 5,089 in chunks of 1,024, 5,199 in one of 2,048; docs/benchmarks.md), not on
// the cpu. The cpu's is also `mer trace`'s, whose recordings replay on either backend.
inline constexpr int kCpuPromptChunkTokens = 256;
inline constexpr int kCudaPromptChunkTokens = 1024;
int DefaultPromptChunkTokens(std::string_view backend);

// Whether the backend can compute over a VRAM expert arena that mer-residency fills (exported
// over CUDA IPC, BackendOptions::vram_residency): cuda.
bool SharesArenaWithResidency(std::string_view backend);

// What the process must set before the backend's first runtime call: with misses decided on the
// device, cuda needs every kernel loaded when its context is made (CUDA_MODULE_LOADING=EAGER;
// cuda/stream_memops.h, KernelsLoadLazily). Nothing for the cpu.
void PrepareProcessFor(std::string_view backend, bool device_misses);

// --gpus's "0,1,...": CUDA ordinals (0 to kMaxGpuOrdinal), one per rank, a GPU possibly repeated.
// InvalidArgument naming --gpus for an empty list, an empty item or one that is not an ordinal.
inline constexpr int kMaxGpuOrdinal = 1023;
absl::StatusOr<std::vector<int>> ParseGpuList(const std::string& list);
// InvalidArgument unless a --gpus list (empty: none given) names one GPU per expert rank of the
// cuda backend.
absl::Status CheckGpuList(const std::vector<int>& gpus, int expert_ranks, std::string_view backend);

// The mer-residency instance of expert rank `rank` when the ranks share one instance name: NAME
// for rank 0, NAME.rank<r> for the others (mer up's and the mer-residency@.service units' names).
std::string RankResidencyInstance(const std::string& name, int rank);

// InvalidArgument for an unknown backend, a bad budget or a GPU list that is not one GPU per rank
// (or not the cuda backend's); Unimplemented for `cuda` in a build without it, and for what the
// cuda ranks do not build (replicated experts, a rank's share that does not fit its arena); the
// backend's own errors otherwise (no GPU, VRAM too small, ...).
absl::StatusOr<CreatedBackend> CreateBackend(const ModelWeights& weights, ExpertSource& experts,
                                             const BackendOptions& options);

// How the backend of `options` wants host memory that it uploads experts from page-locked in this
// process, for an ExpertSource whose memory is not the model file's mapping (mer-residency's RAM
// tier: ResidencyExpertSourceOptions::pin_ram_tier). cuda with pin_host_experts:
// cudaHostRegister; empty otherwise (the cpu backend reads experts in place; no cuda in the build).
HostMemoryPinner HostMemoryPinnerFor(const BackendOptions& options);

}  // namespace mer
