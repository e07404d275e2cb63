#include "services/compute/backend_factory.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"
#include "common/base/threads.h"
#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/cpu/in_process_exchange.h"
#include "services/compute/expert_parallel.h"
#include "services/compute/expert_parallel_backend.h"
#if MER_HAVE_CUDA
#include "services/compute/cuda/cuda_engine.h"
#include "services/compute/cuda/host_memory.h"
#include "services/compute/cuda/multi_token_kernels.h"
#include "services/compute/cuda/nccl_exchange.h"
#endif

namespace mer {
namespace {

// Rank r's placement and expert source, kept in `group` for as long as the ranks live: `experts`
// serves rank 0, o.rank_experts(r) the others (an ExpertSource serves one engine).
struct RankParts {
  const ExpertPlacement* placement;
  ExpertSource* source;
};
absl::StatusOr<RankParts> AddRank(int r, ExpertSource& experts, const BackendOptions& o,
                                  ExpertParallelBackend::Group& group) {
  ASSIGN_OR_RETURN(ExpertPlacement placement, ExpertPlacement::Create(o.expert_ranks, r));
  group.placements.push_back(std::make_unique<ExpertPlacement>(std::move(placement)));
  RankParts parts{group.placements.back().get(), &experts};
  if (r > 0) {
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertSource> own, o.rank_experts(r));
    parts.source = own.get();
    group.sources.push_back(std::move(own));
  }
  return parts;
}

#if MER_HAVE_CUDA
// "BYTES" or "PERCENT%" into the cuda options' two caps.
absl::Status ParseVramBudget(const std::string& b, CudaEngineOptions* co) {
  if (b.empty()) return absl::OkStatus();
  char* end = nullptr;
  const double v = std::strtod(b.c_str(), &end);
  if (end == b.c_str() || v <= 0) return absl::InvalidArgumentError("--vram-expert-budget: BYTES or PERCENT%");
  if (*end == '%') {
    if (v > 100) return absl::InvalidArgumentError("--vram-expert-budget: at most 100%");
    co->vram_expert_budget_fraction = v / 100.0;
  } else if (*end == '\0') {
    co->vram_expert_budget_bytes = static_cast<int64_t>(v);
  } else {
    return absl::InvalidArgumentError("--vram-expert-budget: BYTES or PERCENT%");
  }
  return absl::OkStatus();
}

// o.expert_ranks CudaEngine ranks behind one ExpertParallelBackend, rank r on GPU o.gpus[r] (GPU r
// without a list): the NCCL exchange where every rank has a GPU of its own, the host's where some
// share one (NCCL takes one rank per device).
absl::StatusOr<CreatedBackend> CreateCudaRanks(const ModelWeights& weights, ExpertSource& experts, CudaEngineOptions co,
                                               const BackendOptions& o) {
  const int n = o.expert_ranks;
  if (!o.rank_experts) return absl::InvalidArgumentError("expert ranks: no expert source for the ranks above 0");
  if (!CudaEngine::DeviceAvailable()) return absl::FailedPreconditionError("no CUDA device is available");
  std::vector<int> gpus = o.gpus;
  for (int r = 0; gpus.empty() && r < n; ++r) gpus.push_back(r);
  bool shared = false;
  for (size_t r = 0; r < gpus.size(); ++r)
    shared = shared || std::find(gpus.begin(), gpus.begin() + r, gpus[r]) != gpus.begin() + r;
  std::unique_ptr<InProcessExchangeGroup> host;
  std::unique_ptr<NcclExchangeGroup> device;
  if (shared) {
    host = std::make_unique<InProcessExchangeGroup>(n);
  } else {
    ASSIGN_OR_RETURN(device, NcclExchangeGroup::Create(gpus));
  }
  ExpertParallelBackend::Group group;
  std::vector<std::unique_ptr<ComputeBackend>> ranks;
  for (int r = 0; r < n; ++r) {
    ASSIGN_OR_RETURN(const RankParts rank, AddRank(r, experts, o, group));
    co.device = gpus[r];
    co.placement = rank.placement;
    co.device_exchange = device != nullptr ? &device->rank(r) : nullptr;
    co.host_exchange = host != nullptr ? &host->rank(r) : nullptr;
    // Rank 0 registers the mapped file for every GPU (cudaHostRegisterPortable); a second
    // registration of the same memory would fail.
    co.pin_host_experts = o.pin_host_experts && r == 0;
    // A rank's arena holds its whole share, filled by the engine from the rank's own source (its
    // mer-residency's RAM tier when served): no instance places experts in it.
    co.vram_residency = nullptr;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaEngine> engine, CudaEngine::Create(weights, *rank.source, co));
    ranks.push_back(std::move(engine));
  }
  if (host != nullptr) {
    group.exchange = std::move(host);
  } else {
    group.exchange = std::move(device);
  }
  CreatedBackend out;
  out.threads = n;
  ASSIGN_OR_RETURN(out.engine, ExpertParallelBackend::Create(std::move(group), std::move(ranks)));
  return out;
}
#endif

// o.expert_ranks CpuEngine ranks behind one ExpertParallelBackend, the threads split evenly.
absl::StatusOr<CreatedBackend> CreateCpuRanks(const ModelWeights& weights, ExpertSource& experts, CpuEngineOptions co,
                                              const BackendOptions& o) {
  const int n = o.expert_ranks;
  if (!o.rank_experts) return absl::InvalidArgumentError("expert ranks: no expert source for the ranks above 0");
  co.threads = std::max(1, ResolveThreads(o.threads) / n);
  ExpertParallelBackend::Group group;
  auto exchange = std::make_unique<InProcessExchangeGroup>(n);
  std::vector<std::unique_ptr<ComputeBackend>> ranks;
  CreatedBackend out;
  for (int r = 0; r < n; ++r) {
    ASSIGN_OR_RETURN(const RankParts rank, AddRank(r, experts, o, group));
    co.placement = rank.placement;
    co.exchange = &exchange->rank(r);
    ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> engine, CpuEngine::Create(weights, *rank.source, co));
    out.threads += engine->options().threads;
    ranks.push_back(std::move(engine));
  }
  group.exchange = std::move(exchange);
  HotExpertReplication replication;
  replication.per_layer = o.replicate_hot_experts;
  ASSIGN_OR_RETURN(out.engine, ExpertParallelBackend::Create(std::move(group), std::move(ranks), replication));
  return out;
}

}  // namespace

absl::StatusOr<CreatedBackend> CreateBackend(const ModelWeights& weights, ExpertSource& experts,
                                             const BackendOptions& o) {
  CreatedBackend out;
  if (o.expert_ranks < 1 || o.expert_ranks > kMaxExpertRanks)
    return absl::InvalidArgumentError(absl::StrCat("--expert-ranks ", o.expert_ranks, ": 1 to ", kMaxExpertRanks));
  if (o.replicate_hot_experts != 0 && o.expert_ranks < 2)
    return absl::InvalidArgumentError("--replicate-hot-experts needs --expert-ranks 2 or more");
  RETURN_IF_ERROR(CheckGpuList(o.gpus, o.expert_ranks, o.backend));
  if (o.backend == "cuda" && o.expert_ranks > 1 && o.replicate_hot_experts != 0)
    return absl::UnimplementedError(
        "--replicate-hot-experts with --backend cuda: replicated experts are not built on the cuda ranks (each "
        "rank's arena holds its share only)");
  if (o.backend == "cuda") {
#if MER_HAVE_CUDA
    CudaEngineOptions co;
    co.max_batch_tokens = std::clamp(o.max_batch_tokens, 1, 4096);
    co.max_sequences = o.max_sequences;
    co.max_context_tokens = o.max_context_tokens;
    co.pin_host_experts = o.pin_host_experts;
    co.vram_prefetch = o.vram_prefetch;
    co.profile_kernels = o.profile_kernels;
    if (o.attention_split_min_cells.has_value()) co.attention_split_min_cells = *o.attention_split_min_cells;
    if (o.attention_flash_min_tokens.has_value()) co.attention_flash_min_tokens = *o.attention_flash_min_tokens;
    co.vram_residency = o.vram_residency;
    co.device_misses = o.device_misses;
    if (o.arena_policy != "lfu" && o.arena_policy != "lru")
      return absl::InvalidArgumentError(absl::StrCat("unknown arena policy '", o.arena_policy, "' (lfu or lru)"));
    co.arena_policy = o.arena_policy == "lru" ? cuda::ArenaPolicy::kLru : cuda::ArenaPolicy::kLfu;
    if (!o.multi_token_kernels.empty()) {
      const std::map<std::string, cuda::MultiTokenQ8_0> kinds = {{"auto", cuda::MultiTokenQ8_0::kAuto},
                                                                 {"dp4a", cuda::MultiTokenQ8_0::kDp4a},
                                                                 {"exact", cuda::MultiTokenQ8_0::kMmaExact},
                                                                 {"fast", cuda::MultiTokenQ8_0::kMmaFast}};
      const auto kind = kinds.find(o.multi_token_kernels);
      if (kind == kinds.end())
        return absl::InvalidArgumentError(
            absl::StrCat("unknown multi-token kernels '", o.multi_token_kernels, "' (auto, dp4a, exact or fast)"));
      cuda::SetMultiTokenQ8_0(kind->second);
    }
    RETURN_IF_ERROR(ParseVramBudget(o.vram_expert_budget, &co));
    if (o.expert_ranks > 1) return CreateCudaRanks(weights, experts, co, o);
    if (!o.gpus.empty()) co.device = o.gpus[0];
    ASSIGN_OR_RETURN(out.engine, CudaEngine::Create(weights, experts, co));
    out.threads = 1;
    return out;
#else
    return absl::UnimplementedError("this build has no cuda backend (configured with MER_CUDA=OFF or without nvcc)");
#endif
  }
  if (o.backend != "cpu")
    return absl::InvalidArgumentError(absl::StrCat("backend '", o.backend, "': must be cpu or cuda"));
  if (!o.vram_expert_budget.empty()) return absl::InvalidArgumentError("--vram-expert-budget needs --backend cuda");
  if (!o.multi_token_kernels.empty()) return absl::InvalidArgumentError("--multi-token-kernels needs --backend cuda");
  CpuEngineOptions co;
  co.threads = o.threads;
  co.max_batch_tokens = o.max_batch_tokens;
  co.max_sequences = o.max_sequences;
  co.max_context_tokens = o.max_context_tokens;
  if (o.expert_ranks > 1) return CreateCpuRanks(weights, experts, co, o);
  ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> engine, CpuEngine::Create(weights, experts, co));
  out.threads = engine->options().threads;
  out.engine = std::move(engine);
  return out;
}

std::string RankResidencyInstance(const std::string& name, int rank) {
  return rank == 0 ? name : absl::StrCat(name, ".rank", rank);
}

absl::Status CheckGpuList(const std::vector<int>& gpus, int expert_ranks, std::string_view backend) {
  if (gpus.empty()) return absl::OkStatus();
  if (backend != "cuda") return absl::InvalidArgumentError("--gpus needs --backend cuda");
  if (static_cast<int>(gpus.size()) == expert_ranks) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--gpus lists ", gpus.size(), " GPU(s) for --expert-ranks ", expert_ranks, ": one per rank"));
}

absl::StatusOr<std::vector<int>> ParseGpuList(const std::string& list) {
  std::vector<int> gpus;
  for (absl::string_view item : absl::StrSplit(list, ',')) {
    int gpu = -1;
    if (!absl::SimpleAtoi(item, &gpu) || gpu < 0 || gpu > kMaxGpuOrdinal)
      return absl::InvalidArgumentError(absl::StrCat("--gpus '", list, "': '", item,
                                                     "' is not a GPU (CUDA ordinals 0 to ", kMaxGpuOrdinal,
                                                     ", comma-separated, one per expert rank)"));
    gpus.push_back(gpu);
  }
  return gpus;
}

int DefaultPromptChunkTokens(std::string_view backend) {
  return backend == "cuda" ? kCudaPromptChunkTokens : kCpuPromptChunkTokens;
}

bool SharesArenaWithResidency(std::string_view backend) { return backend == "cuda"; }

void PrepareProcessFor(std::string_view backend, bool device_misses) {
  if (backend == "cuda" && device_misses) setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/1);
}

HostMemoryPinner HostMemoryPinnerFor(const BackendOptions& options) {
#if MER_HAVE_CUDA
  if (options.backend == "cuda" && options.pin_host_experts) return CudaRegisterHostMemory;
#endif
  return {};
}

}  // namespace mer
