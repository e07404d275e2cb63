#include "services/compute/expert_parallel_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace mer {

absl::StatusOr<std::unique_ptr<ExpertParallelBackend>> ExpertParallelBackend::Create(
    Group group, std::vector<std::unique_ptr<ComputeBackend>> ranks, HotExpertReplication replication) {
  const size_t n = ranks.size();
  if (n == 0 || group.exchange == nullptr || group.placements.size() != n ||
      group.exchange->n_ranks() != static_cast<int>(n))
    return absl::InvalidArgumentError(absl::StrCat(
        "expert-parallel backend: ", n, " ranks, ", group.placements.size(), " placements and an exchange of ",
        group.exchange != nullptr ? group.exchange->n_ranks() : 0, " ranks (they must agree)"));
  for (size_t r = 0; r < n; ++r) {
    if (ranks[r] == nullptr || group.placements[r] == nullptr || group.placements[r]->rank() != static_cast<int>(r) ||
        group.placements[r]->n_ranks() != static_cast<int>(n))
      return absl::InvalidArgumentError(absl::StrCat("expert-parallel backend: rank ", r, " is missing or misplaced"));
    const ComputeBackend& a = *ranks[0];
    const ComputeBackend& b = *ranks[r];
    if (b.max_batch_tokens() != a.max_batch_tokens() || b.max_sequences() != a.max_sequences() ||
        b.max_context_tokens() != a.max_context_tokens() || b.config().n_layer != a.config().n_layer ||
        b.config().n_vocab != a.config().n_vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("expert-parallel backend: rank ", r, "'s model or sizes differ from rank 0's"));
  }
  if (replication.per_layer < 0 || replication.per_layer > ranks[0]->config().n_expert || replication.every_calls < 1)
    return absl::InvalidArgumentError(absl::StrCat("expert-parallel backend: ", replication.per_layer,
                                                   " hot experts a layer of ", ranks[0]->config().n_expert,
                                                   ", chosen every ", replication.every_calls, " calls"));
  return std::unique_ptr<ExpertParallelBackend>(
      new ExpertParallelBackend(std::move(group), std::move(ranks), replication));
}

ExpertParallelBackend::ExpertParallelBackend(Group group, std::vector<std::unique_ptr<ComputeBackend>> ranks,
                                             HotExpertReplication replication)
    : group_(std::move(group)),
      ranks_(std::move(ranks)),
      replication_(replication),
      hot_(ranks_[0]->config().n_layer, ranks_[0]->config().n_expert),
      results_(ranks_.size()) {
  scratch_ids_.resize(size_t(ranks_.size()) * ranks_[0]->max_batch_tokens());
  if (replication_.per_layer > 0) ranks_[0]->set_routing_observer(&hot_observer_);
  for (int r = 1; r < n_ranks(); ++r) workers_.emplace_back([this, r] { Worker(r); });
}

void ExpertParallelBackend::HotExpertObserver::OnRouting(int layer, absl::Span<const int32_t> experts_per_token,
                                                         int k) {
  counter_.Count(layer, experts_per_token);
  if (next != nullptr) next->OnRouting(layer, experts_per_token, k);
}

void ExpertParallelBackend::set_routing_observer(RoutingObserver* observer) {
  if (replication_.per_layer > 0) {
    hot_observer_.next = observer;
  } else {
    ranks_[0]->set_routing_observer(observer);
  }
}

void ExpertParallelBackend::MaybeReplicate() {
  if (replication_.per_layer == 0 || ++calls_ % uint64_t(replication_.every_calls) != 0) return;
  // Between calls: no rank is inside a step, so every placement changes before any reads it again.
  const std::vector<std::pair<int, int>> hot = hot_.ChooseAndAge(replication_.per_layer);
  for (const std::unique_ptr<ExpertPlacement>& placement : group_.placements) {
    placement->ClearReplicas();
    for (const auto& [layer, expert] : hot) placement->Replicate(layer, expert);
  }
}

ExpertParallelBackend::~ExpertParallelBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ExpertParallelBackend::Worker(int rank) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
    if (stopping_) return;
    seen = generation_;
    const absl::FunctionRef<absl::Status(int)>& work = *work_;
    lock.unlock();
    absl::Status status = work(rank);
    lock.lock();
    results_[rank] = std::move(status);
    if (--running_ == 0) cv_.notify_all();
  }
}

absl::Status ExpertParallelBackend::OnEveryRank(absl::FunctionRef<absl::Status(int)> work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    work_ = &work;
    running_ = n_ranks() - 1;
    ++generation_;
  }
  cv_.notify_all();
  results_[0] = work(0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return running_ == 0; });
  work_ = nullptr;
  absl::Status status = results_[0];
  for (int r = 1; r < n_ranks() && status.ok(); ++r) status = results_[r];
  if (!status.ok()) group_.exchange->Reset();  // some rank failed, and every rank has returned
  return status;
}

absl::Status ExpertParallelBackend::Forward(absl::Span<const BatchToken> batch, float* logits) {
  // Ranks > 0 compute the same logits; they take the argmax path so that nothing is copied twice.
  const absl::Status status = OnEveryRank([&](int rank) {
    if (rank == 0) return ranks_[0]->Forward(batch, logits);
    return ranks_[rank]->ForwardArgmax(batch, &scratch_ids_[size_t(rank) * max_batch_tokens()]);
  });
  MaybeReplicate();
  return status;
}

absl::Status ExpertParallelBackend::ForwardArgmax(absl::Span<const BatchToken> batch, int32_t* ids) {
  const absl::Status status = OnEveryRank([&](int rank) {
    return ranks_[rank]->ForwardArgmax(batch, rank == 0 ? ids : &scratch_ids_[size_t(rank) * max_batch_tokens()]);
  });
  MaybeReplicate();
  return status;
}

void ExpertParallelBackend::ClearSequence(int sequence) {
  for (const std::unique_ptr<ComputeBackend>& rank : ranks_) rank->ClearSequence(sequence);
}

absl::Status ExpertParallelBackend::set_route_override(RouteOverride* route) {
  if (route == nullptr) return absl::OkStatus();
  return absl::UnimplementedError(
      "preselected routes with expert ranks: every rank would call the override for every layer, "
      "where it expects one call per layer");
}

BackendCounters ExpertParallelBackend::counters() const {
  BackendCounters c = ranks_[0]->counters();
  for (int r = 1; r < n_ranks(); ++r) {
    const BackendCounters o = ranks_[r]->counters();
    c.expert_pairs += o.expert_pairs;
    c.expert_lookups += o.expert_lookups;
    c.expert_misses += o.expert_misses;
    c.expert_upload_bytes += o.expert_upload_bytes;
    c.evictions += o.evictions;
  }
  c.replicated_experts = static_cast<int64_t>(replicas());
  return c;
}

std::vector<BackendCounters> ExpertParallelBackend::rank_counters() const {
  std::vector<BackendCounters> out;
  out.reserve(ranks_.size());
  for (const auto& rank : ranks_) out.push_back(rank->counters());
  return out;
}

}  // namespace mer
