#include "services/compute/backend_factory.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "services/compute/cpu/cpu_engine.h"
#if MER_HAVE_CUDA
#include "services/compute/cuda/cuda_engine.h"
#include "services/compute/cuda/host_memory.h"
#endif

namespace mer {
namespace {

#if MER_HAVE_CUDA
// "BYTES" or "PERCENT%" into the cuda options' two caps.
absl::Status ParseVramBudget(const std::string& b, CudaEngineOptions* co) {
  if (b.empty()) return absl::OkStatus();
  char* end = nullptr;
  const double v = std::strtod(b.c_str(), &end);
  if (end == b.c_str() || v <= 0)
    return absl::InvalidArgumentError("--vram-expert-budget: BYTES or PERCENT%");
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
#endif

}  // namespace

absl::StatusOr<CreatedBackend> CreateBackend(const ModelWeights& weights, ExpertSource& experts,
                                             const BackendOptions& o) {
  CreatedBackend out;
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
    co.vram_residency = o.vram_residency;
    RETURN_IF_ERROR(ParseVramBudget(o.vram_expert_budget, &co));
    ASSIGN_OR_RETURN(out.engine, CudaEngine::Create(weights, experts, co));
    out.threads = 1;
    return out;
#else
    return absl::UnimplementedError("this build has no cuda backend (configured with MER_CUDA=OFF or without nvcc)");
#endif
  }
  if (o.backend != "cpu")
    return absl::InvalidArgumentError(absl::StrCat("backend '", o.backend, "': must be cpu or cuda"));
  if (!o.vram_expert_budget.empty())
    return absl::InvalidArgumentError("--vram-expert-budget needs --backend cuda");
  CpuEngineOptions co;
  co.threads = o.threads;
  co.max_batch_tokens = o.max_batch_tokens;
  co.max_sequences = o.max_sequences;
  co.max_context_tokens = o.max_context_tokens;
  ASSIGN_OR_RETURN(std::unique_ptr<CpuEngine> engine, CpuEngine::Create(weights, experts, co));
  out.threads = engine->options().threads;
  out.engine = std::move(engine);
  return out;
}

std::string BackendKernelProfile(const ComputeBackend& engine, const std::string& backend_name) {
#if MER_HAVE_CUDA
  if (backend_name == "cuda") return static_cast<const CudaEngine&>(engine).KernelProfile();
#endif
  return {};
}

HostMemoryPinner HostMemoryPinnerFor(const BackendOptions& options) {
#if MER_HAVE_CUDA
  if (options.backend == "cuda" && options.pin_host_experts) return CudaRegisterHostMemory;
#endif
  return {};
}

BackendCounters ReadBackendCounters(const ComputeBackend& engine, const std::string& backend_name) {
  BackendCounters b;
#if MER_HAVE_CUDA
  if (backend_name != "cuda") return b;
  const CudaEngineStats s = static_cast<const CudaEngine&>(engine).stats();
  b.tokens = s.tokens;
  b.expert_lookups = s.expert_lookups;
  b.expert_misses = s.expert_misses;
  b.upload_bytes = s.expert_upload_bytes;
  b.evictions = s.evictions;
  b.vram_prefetch_issued = s.vram_prefetch_issued;
  b.vram_prefetch_useful = s.vram_prefetch_useful;
  b.vram_prefetch_wasted = s.vram_prefetch_wasted;
  b.host_syncs = s.host_syncs;
  b.graph_launches = s.graph_launches;
  b.vram_used_bytes = s.vram_used_bytes;
  b.vram_used_peak_bytes = s.vram_used_peak_bytes;
  b.dense_bytes = s.dense_bytes;
  b.kv_bytes = s.kv_bytes;
  b.workspace_bytes = s.workspace_bytes;
  b.arena_bytes = s.arena_bytes;
  b.arena_slots = s.arena_slots;
  b.arena_resident = s.arena_resident;
  b.arena_placed_by_residency = s.arena_placed_by_residency;
  b.total_experts = s.total_experts;
  b.host_experts_pinned = s.host_experts_pinned;
#endif
  return b;
}

}  // namespace mer
