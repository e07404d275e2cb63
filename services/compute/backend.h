// The seam between mer-compute's scheduling and the hardware that runs the forward pass: the
// `cpu` backend (services/compute/cpu/, the reference) and the `cuda` backend implement it, and
// everything above (generation, the compute daemon's continuous batching) sees only this class.
//
// A backend owns the KV cache of `max_sequences` sequence slots and the workspaces for batches of
// up to `max_batch_tokens` tokens, all reserved when it is created.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model/model_config.h"

namespace mer {

// One token of a batch: `token` at `position` of sequence `sequence`. Positions of a sequence
// must be filled in order: a token attends to positions [0, position] of its sequence, which must
// be in the KV cache already or earlier in the same batch. A batch may mix sequences (continuous
// batching) and several positions of one sequence (chunked prompt processing).
struct BatchToken {
  int32_t token = 0;
  int32_t position = 0;
  int32_t sequence = 0;
  bool want_logits = false;
};

// Called after each layer's routing with the experts chosen for every token of the batch
// (top-k ids, row-major [n_tokens, k]); for routing traces and residency hints.
class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  virtual void OnRouting(int layer, absl::Span<const int32_t> experts_per_token, int k) = 0;
};

// Preselected routes: a layer's experts (and optionally their weights) given for every token of a
// step instead of the router's top-k, for qualification (the same routes through two backends,
// compared bit for bit) and for replaying recorded routings. Route fills ids [n, k] (row-major,
// k distinct ids in [0, n_expert) per token) and, if it returns weights, weights [n, k]; without
// weights the router's probabilities of the given experts are used, renormalised as the model's
// norm_topk_prob says, exactly as the router's own choice is (given weights are used as they are).
// Returning false leaves the layer to the router. Ids or weights that are out of range fail the
// step with InvalidArgument (CheckPreselectedRoute, preselected_route.h), and the engine goes on.
// Route is called once per layer of every step, layer 0 first and in order: the cpu backend as it
// reaches the layer, the cuda backend for every layer before it launches the step.
class RouteOverride {
 public:
  virtual ~RouteOverride() = default;
  // *has_weights: whether `weights` was filled.
  virtual bool Route(int layer, int n, int k, int32_t* ids, float* weights, bool* has_weights) = 0;
};

// What a backend counts (cumulative since it was created) and its device memory, bytes. The cpu
// backend counts only tokens and forward_calls; `device` says whether the rest means anything.
// mer-compute exports them as metrics (services/compute/daemon/compute_metrics.h), `mer bench`
// prints them.
struct BackendCounters {
  bool device = false;  // a backend with a device arena (cuda): the fields below count
  int gpu = -1;         // its device's CUDA ordinal
  int64_t forward_calls = 0;
  int64_t tokens = 0;  // batch tokens processed
  // (token, expert) pairs whose expert FFN this backend computed, summed over layers (an
  // expert-parallel rank computes only the pairs placed on it).
  int64_t expert_pairs = 0;
  // An expert-parallel rank's count, over layers and steps, of the pairs of the group's busiest
  // rank in that layer (every rank counts the same): the expert part waits for that rank, so the
  // group's expert pairs over this is the expert work's speed-up over one rank.
  int64_t busiest_rank_pairs = 0;
  int64_t replicated_experts = 0;  // expert-parallel ranks: (layer, expert) held by every rank now
  // An expert-parallel rank's wall time in its layers' exchanges on the host (waiting for the
  // slowest rank, then summing), microseconds. A cuda rank that sums on its GPU (NCCL) counts none:
  // its exchanges are device work inside the step.
  int64_t exchange_seconds_x1e6 = 0;
  int64_t expert_lookups = 0;         // distinct (layer, expert) a batch needs, summed over layers
  int64_t expert_misses = 0;          // of those, not in the arena
  int64_t expert_upload_bytes = 0;    // host -> VRAM
  int64_t evictions = 0;              // arena slots reused for another expert
  int64_t host_syncs = 0;             // stream/event synchronisations inside Forward
  int64_t graph_launches = 0;         // steps replayed as a CUDA graph
  int64_t attention_split_steps = 0;  // steps whose attention ran split-K
  int64_t attention_flash_steps = 0;  // steps whose attention ran on the tensor cores (cuda)
  int64_t vram_prefetch_issued = 0;   // experts uploaded ahead of demand by the look-ahead
  int64_t vram_prefetch_useful = 0;   // of those, used by the layer they were predicted for
  int64_t vram_prefetch_wasted = 0;   // not used by it
  int64_t upload_seconds_x1e6 = 0;    // wall time of miss servicing (host side), microseconds
  // Misses decided on the device (cuda with the arena placed by mer-residency): routing records
  // the device posted, and of those the layers that missed and the miss service served.
  int64_t device_routing_records = 0;
  int64_t device_served_layers = 0;
  // Memory, bytes.
  int64_t dense_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t arena_bytes = 0;
  int64_t arena_slots = 0;
  int64_t arena_resident = 0;  // slots holding an expert (sampled when read)
  // mer-residency places the arena's experts (exported over CUDA IPC): the slots' states are its
  // to report; arena_resident counts nothing here.
  bool arena_placed_by_residency = false;
  int64_t slot_bytes = 0;
  int64_t total_experts = 0;  // the experts an arena holds to miss none (a cuda rank's: its share)
  int64_t vram_total_bytes = 0;
  int64_t vram_used_bytes = 0;  // device-wide (total - free), when sampled
  int64_t vram_used_peak_bytes = 0;
  bool host_experts_pinned = false;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  virtual const ModelConfig& config() const = 0;
  virtual int max_batch_tokens() const = 0;    // tokens per Forward call
  virtual int max_sequences() const = 0;       // KV cache slots
  virtual int max_context_tokens() const = 0;  // KV positions per sequence

  // Runs the batch; for each token with want_logits, in batch order, writes n_vocab f32 logits to
  // `logits` (host memory, sized for that many rows). InvalidArgument for a bad token, position or
  // sequence; errors of the expert source are passed on (the KV entries of this batch are then
  // undefined, the sequences' earlier entries are kept). One Forward at a time.
  virtual absl::Status Forward(absl::Span<const BatchToken> batch, float* logits) = 0;
  // Forward for greedy decoding: for each token with want_logits, in batch order, writes the id of
  // its largest logit (Sampler::Argmax: the lowest id on ties, NaNs never chosen unless at id 0) to
  // `ids` instead of the logits, which a backend may keep where they are computed (the cuda
  // backend copies 4 bytes per row instead of n_vocab floats). Same errors as Forward.
  virtual absl::Status ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) = 0;
  // Greedy decoding of one sequence: feeds `token` at `position`, passes the step's argmax to
  // on_token, and while on_token returns true feeds that id at the next position, at most
  // max_steps steps in all. The ids and the KV entries are those of a loop of ForwardArgmax (the
  // default below); a backend may start step i + 1 before on_token has seen step i's id (the
  // cuda backend does), so when on_token returns false one step more may have run, and its KV
  // entry (the position after the last one fed) is left as undefined as an unused one.
  virtual absl::Status DecodeGreedy(int sequence, int32_t token, int32_t position, int max_steps,
                                    const std::function<bool(int32_t)>& on_token) {
    for (int i = 0; i < max_steps; ++i) {
      const BatchToken b{token, position + i, sequence, true};
      if (absl::Status s = ForwardArgmax(absl::MakeConstSpan(&b, 1), &token); !s.ok()) return s;
      if (!on_token(token)) break;
    }
    return absl::OkStatus();
  }

  // Forgets the sequence's KV entries (its slot can take a new sequence at position 0).
  virtual void ClearSequence(int sequence) = 0;
  // Positions [0, sequence_length) of the sequence are in the KV cache.
  virtual int32_t sequence_length(int sequence) const = 0;

  // Not owned; nullptr turns it off. Set between Forward calls.
  virtual void set_routing_observer(RoutingObserver* observer) = 0;
  // Not owned; nullptr turns it off. Set between Forward calls. Unimplemented where the backend
  // takes no preselected routes (the cpu and cuda backends take them).
  virtual absl::Status set_route_override(RouteOverride* route) {
    if (route == nullptr) return absl::OkStatus();
    return absl::UnimplementedError("this backend takes no preselected routes");
  }

  // The counters above; read by the thread that runs Forward (between calls).
  virtual BackendCounters counters() const = 0;
  // Each expert-parallel rank's own counters, rank r's the r-th (same thread rule); empty for a
  // backend that is not made of ranks.
  virtual std::vector<BackendCounters> rank_counters() const { return {}; }
  // Where the time of each kind of kernel went, when the backend was asked to time them (the
  // cuda backend's profile_kernels); empty otherwise.
  virtual std::string KernelProfile() const { return {}; }
};

}  // namespace mer
