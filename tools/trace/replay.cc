#include "tools/trace/replay.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "services/residency/policy/replacement_policy.h"

namespace mer::trace {

using residency::CreatePolicy;
using residency::ExpertKey;
using residency::ExpertPrediction;
using residency::KeyExpert;
using residency::KeyLayer;
using residency::PackExpertKey;
using residency::PrefetchPredictor;
using residency::ReplacementPolicy;

int64_t SlotsForFraction(const TraceGeometry& g, double fraction) {
  const double all = static_cast<double>(g.n_layer) * g.n_expert;
  return std::max<int64_t>(1, std::llround(all * fraction));
}

namespace {

class Simulator {
 public:
  Simulator(const RoutingTrace& trace, const ReplayOptions& o, std::unique_ptr<ReplacementPolicy> policy,
            int64_t expert_bytes)
      : trace_(trace),
        g_(trace.geometry()),
        o_(o),
        policy_(std::move(policy)),
        predictor_(g_.n_layer, g_.n_expert, o.predictor),
        budget_(o.prefetch_budget > 0 ? o.prefetch_budget : g_.top_k) {
    const size_t keys = static_cast<size_t>(g_.n_layer) * g_.n_expert;
    pinned_.assign(keys, 0);
    prefetched_.assign(keys, 0);
    seen_.assign(g_.n_expert, 0);
    distinct_.reserve(g_.n_expert);
    token_.resize(g_.top_k);
    stats_.slots = o.slots;
    stats_.expert_bytes = expert_bytes;
  }

  ReplayStats Run() {
    const auto& records = trace_.records();
    for (size_t r = 0; r < records.size(); ++r) {
      const RoutingTrace::Record& rec = records[r];
      const bool decode = rec.phase == TracePhase::kDecode;
      counting_ = decode || o_.count_prompt;
      if (counting_) stats_.tokens += rec.n_tokens;
      const bool prefetch = o_.prefetch && decode && rec.n_tokens == 1;
      for (int l = 0; l < g_.n_layer; ++l) {
        DistinctExperts(r, l);
        for (int32_t e : distinct_) pinned_[Index(l, e)] = 1;
        for (int32_t e : distinct_) Demand(PackExpertKey(l, e));
        if (prefetch) {
          // Learn this layer, then guess the next one (layer 0 of the next token after the last).
          Observe(r, 0, l);
          const bool last = l + 1 == g_.n_layer;
          if (!last || r + 1 < records.size()) Prefetch(last ? 0 : l + 1);
        }
        for (int32_t e : distinct_) pinned_[Index(l, e)] = 0;
      }
      if (o_.prefetch && !prefetch) {  // the predictor learns from batches too
        for (int32_t t = 0; t < rec.n_tokens; ++t)
          for (int l = 0; l < g_.n_layer; ++l) Observe(r, t, l);
      }
    }
    // Prefetched experts never used by the end are wasted too.
    for (uint8_t p : prefetched_) stats_.prefetch_wasted += p;
    stats_.misses = stats_.lookups - stats_.hits;
    stats_.demand_bytes = stats_.misses * stats_.expert_bytes;
    stats_.stall_seconds = static_cast<double>(stats_.misses) * o_.latency_us * 1e-6 +
                           static_cast<double>(stats_.demand_bytes) / (o_.bandwidth_gbps * 1e9);
    return stats_;
  }

 private:
  size_t Index(int layer, int expert) const { return static_cast<size_t>(layer) * g_.n_expert + expert; }
  size_t Index(ExpertKey k) const { return Index(KeyLayer(k), KeyExpert(k)); }

  void DistinctExperts(size_t r, int l) {
    distinct_.clear();
    if (++stamp_ == 0) {
      std::fill(seen_.begin(), seen_.end(), 0);
      stamp_ = 1;
    }
    for (uint16_t e : trace_.Experts(r, l)) {
      if (seen_[e] == stamp_) continue;
      seen_[e] = stamp_;
      distinct_.push_back(e);
    }
  }

  void Observe(size_t r, int32_t t, int l) {
    absl::Span<const uint16_t> ids = trace_.Experts(r, l).subspan(static_cast<size_t>(t) * g_.top_k, g_.top_k);
    std::copy(ids.begin(), ids.end(), token_.begin());
    predictor_.Observe(l, token_);
  }

  void Evict(ExpertKey victim) {
    CHECK(policy_->Remove(victim));
    uint8_t& p = prefetched_[Index(victim)];
    stats_.prefetch_wasted += p;
    p = 0;
  }

  void Demand(ExpertKey key) {
    if (counting_) ++stats_.lookups;
    if (policy_->Contains(key)) {
      policy_->Touch(key);
      if (counting_) ++stats_.hits;
      uint8_t& p = prefetched_[Index(key)];
      stats_.prefetch_useful += p;
      p = 0;
      return;
    }
    if (policy_->size() == policy_->capacity()) {
      const std::optional<ExpertKey> victim =
          policy_->ChooseVictim([this](ExpertKey k) { return !pinned_[Index(k)]; }, key);
      if (!victim) {
        if (counting_) ++stats_.bypassed;
        return;
      }
      Evict(*victim);
    }
    policy_->Admit(key);
  }

  void Prefetch(int layer) {
    predictor_.Predict(layer, o_.confidence, g_.n_expert, &predictions_);
    // Pinned for the step (see replay.h): the resident experts the predictor names, and each
    // expert prefetched, against the step's later prefetches.
    step_.clear();
    for (const ExpertPrediction& p : predictions_) {
      const ExpertKey key = PackExpertKey(layer, p.expert);
      if (policy_->Contains(key) && !pinned_[Index(key)]) {
        pinned_[Index(key)] = 1;
        step_.push_back(key);
      }
    }
    int issued = 0;
    for (const ExpertPrediction& p : predictions_) {
      if (issued == budget_) break;
      const ExpertKey key = PackExpertKey(layer, p.expert);
      if (policy_->Contains(key)) continue;
      if (policy_->size() == policy_->capacity()) {
        // Another layer's expert if there is one, else one of this layer's not predicted.
        std::optional<ExpertKey> victim = policy_->ChooseVictim(
            [this, layer](ExpertKey k) { return !pinned_[Index(k)] && KeyLayer(k) != layer; }, key);
        if (!victim) victim = policy_->ChooseVictim([this](ExpertKey k) { return !pinned_[Index(k)]; }, key);
        if (!victim) break;
        Evict(*victim);
      }
      policy_->AdmitPrefetched(key);
      prefetched_[Index(key)] = 1;
      pinned_[Index(key)] = 1;
      step_.push_back(key);
      ++issued;
    }
    for (ExpertKey k : step_) pinned_[Index(k)] = 0;
    stats_.prefetch_issued += issued;
    stats_.prefetch_bytes += issued * stats_.expert_bytes;
  }

  const RoutingTrace& trace_;
  const TraceGeometry& g_;
  const ReplayOptions& o_;
  std::unique_ptr<ReplacementPolicy> policy_;
  PrefetchPredictor predictor_;
  const int budget_;
  bool counting_ = true;
  ReplayStats stats_;
  std::vector<uint8_t> pinned_;      // [layer * n_expert + expert]
  std::vector<uint8_t> prefetched_;  // resident, prefetched, not yet used
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
  std::vector<int32_t> distinct_;
  std::vector<int32_t> token_;
  std::vector<ExpertPrediction> predictions_;
  std::vector<ExpertKey> step_;
};

}  // namespace

absl::StatusOr<ReplayStats> Replay(const RoutingTrace& trace, const ReplayOptions& options) {
  RETURN_IF_ERROR(ValidateTraceGeometry(trace.geometry()));
  const int64_t expert_bytes = options.expert_bytes > 0 ? options.expert_bytes : trace.geometry().expert_bytes;
  if (expert_bytes <= 0) return absl::InvalidArgumentError("the trace does not record the expert size; give it");
  if (!(options.bandwidth_gbps > 0) || !std::isfinite(options.bandwidth_gbps))
    return absl::InvalidArgumentError("bandwidth must be > 0");
  if (!(options.latency_us >= 0) || !std::isfinite(options.latency_us))
    return absl::InvalidArgumentError("latency must be >= 0");
  if (options.prefetch_budget < 0) return absl::InvalidArgumentError("prefetch budget must be >= 0");
  if (!(options.confidence >= 0 && options.confidence <= 1))
    return absl::InvalidArgumentError("prefetch confidence must be in [0, 1]");
  ASSIGN_OR_RETURN(std::unique_ptr<ReplacementPolicy> policy, CreatePolicy(options.policy, options.slots));
  Simulator sim(trace, options, std::move(policy), expert_bytes);
  return sim.Run();
}

}  // namespace mer::trace
