#include "tools/trace/replay.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <utility>
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

// The distinct experts a record routes to at a layer (the lookups of that layer step), in order of
// first use; the vector is reused from call to call.
class DistinctExperts {
 public:
  explicit DistinctExperts(int n_expert) : seen_(n_expert, 0) { distinct_.reserve(n_expert); }
  const std::vector<int32_t>& Of(const RoutingTrace& trace, size_t record, int layer) {
    distinct_.clear();
    if (++stamp_ == 0) {
      std::fill(seen_.begin(), seen_.end(), 0);
      stamp_ = 1;
    }
    for (uint16_t e : trace.Experts(record, layer)) {
      if (seen_[e] == stamp_) continue;
      seen_[e] = stamp_;
      distinct_.push_back(e);
    }
    return distinct_;
  }

 private:
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
  std::vector<int32_t> distinct_;
};

// Belady's MIN: evicts the resident key whose next use lies farthest ahead (one never used again
// first). It reads the future from the trace, so no tier could run it: its misses are the fewest
// any replacement policy can have with the same slots (demand only), the bound the real policies
// are measured against. Steps are record * n_layer + layer, in replay order.
class BeladyBound final : public ReplacementPolicy {
 public:
  BeladyBound(int64_t capacity, const RoutingTrace& trace) : ReplacementPolicy(capacity), g_(trace.geometry()) {
    const size_t keys = static_cast<size_t>(g_.n_layer) * g_.n_expert;
    uses_.resize(keys);
    next_.assign(keys, kAbsent);
    DistinctExperts distinct(g_.n_expert);
    for (size_t r = 0; r < trace.records().size(); ++r) {
      for (int l = 0; l < g_.n_layer; ++l) {
        const int64_t step = static_cast<int64_t>(r) * g_.n_layer + l;
        for (int32_t e : distinct.Of(trace, r, l)) uses_[Index(PackExpertKey(l, e))].push_back(step);
      }
    }
  }

  // The step whose lookups come next.
  void AtStep(int64_t step) { now_ = step; }

  absl::string_view name() const override { return "opt"; }
  int64_t size() const override { return static_cast<int64_t>(by_next_use_.size()); }
  bool Contains(ExpertKey key) const override { return next_[Index(key)] != kAbsent; }
  void Touch(ExpertKey key) override {
    CHECK(Contains(key));
    by_next_use_.erase({next_[Index(key)], key});
    Place(key);
  }
  void Admit(ExpertKey key) override {
    CHECK(!Contains(key) && size() < capacity());
    Place(key);
  }
  bool Remove(ExpertKey key) override {
    if (!Contains(key)) return false;
    by_next_use_.erase({next_[Index(key)], key});
    next_[Index(key)] = kAbsent;
    return true;
  }
  std::vector<ExpertKey> ResidentKeys() const override {
    std::vector<ExpertKey> keys;
    for (const auto& [next, key] : by_next_use_) keys.push_back(key);
    return keys;
  }

 protected:
  std::optional<ExpertKey> DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable, ExpertKey) override {
    for (auto it = by_next_use_.rbegin(); it != by_next_use_.rend(); ++it)
      if (evictable(it->second)) return it->second;
    return std::nullopt;
  }

 private:
  static constexpr int64_t kAbsent = -1;
  static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

  size_t Index(ExpertKey k) const { return static_cast<size_t>(KeyLayer(k)) * g_.n_expert + KeyExpert(k); }
  // Files `key` under its first use after the current step.
  void Place(ExpertKey key) {
    const std::vector<int64_t>& u = uses_[Index(key)];
    const auto next = std::upper_bound(u.begin(), u.end(), now_);
    next_[Index(key)] = next == u.end() ? kNever : *next;
    by_next_use_.insert({next_[Index(key)], key});
  }

  const TraceGeometry& g_;
  std::vector<std::vector<int64_t>> uses_;  // [key index] the steps that look it up, ascending
  std::vector<int64_t> next_;               // [key index] its next use while resident, else kAbsent
  std::set<std::pair<int64_t, ExpertKey>> by_next_use_;
  int64_t now_ = 0;
};

class Simulator {
 public:
  // `belady`: the policy when it is the Belady bound (told each step), else null.
  Simulator(const RoutingTrace& trace, const ReplayOptions& o, std::unique_ptr<ReplacementPolicy> policy,
            BeladyBound* belady, int64_t expert_bytes)
      : belady_(belady),
        trace_(trace),
        g_(trace.geometry()),
        o_(o),
        policy_(std::move(policy)),
        predictor_(g_.n_layer, g_.n_expert, o.predictor),
        budget_(o.prefetch_budget > 0 ? o.prefetch_budget : g_.top_k),
        distinct_(g_.n_expert) {
    const size_t keys = static_cast<size_t>(g_.n_layer) * g_.n_expert;
    pinned_.assign(keys, 0);
    prefetched_.assign(keys, 0);
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
        if (belady_ != nullptr) belady_->AtStep(static_cast<int64_t>(r) * g_.n_layer + l);
        const std::vector<int32_t>& distinct = distinct_.Of(trace_, r, l);
        for (int32_t e : distinct) pinned_[Index(l, e)] = 1;
        for (int32_t e : distinct) Demand(PackExpertKey(l, e));
        if (prefetch) {
          // Learn this layer, then guess the next one (layer 0 of the next token after the last).
          Observe(r, 0, l);
          const bool last = l + 1 == g_.n_layer;
          if (!last || r + 1 < records.size()) Prefetch(last ? 0 : l + 1);
        }
        for (int32_t e : distinct) pinned_[Index(l, e)] = 0;
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

  BeladyBound* const belady_;
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
  DistinctExperts distinct_;
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
  if (options.policy == "opt") {
    if (options.prefetch) return absl::InvalidArgumentError("the opt bound reads the future: it takes no prefetch");
    if (options.slots < 1 || options.slots > ReplacementPolicy::kMaxCapacity)
      return absl::InvalidArgumentError(absl::StrCat("cache capacity ", options.slots, " is out of range"));
    auto belady = std::make_unique<BeladyBound>(options.slots, trace);
    BeladyBound* const bound = belady.get();
    Simulator sim(trace, options, std::move(belady), bound, expert_bytes);
    return sim.Run();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ReplacementPolicy> policy, CreatePolicy(options.policy, options.slots));
  Simulator sim(trace, options, std::move(policy), nullptr, expert_bytes);
  return sim.Run();
}

}  // namespace mer::trace
