#include "services/gateway/scheduler.h"

#include "absl/strings/str_cat.h"

namespace mer::gateway {

void Scheduler::SetCapacity(int max_sequences, int64_t kv_budget_tokens) {
  absl::MutexLock lock(&mu_);
  available_ = true;
  max_sequences_ = max_sequences;
  kv_budget_ = kv_budget_tokens;
}

void Scheduler::SetUnavailable() {
  absl::MutexLock lock(&mu_);
  available_ = false;
  ++epoch_;
}

absl::Status Scheduler::Admit(int priority, int64_t kv_tokens, absl::Time deadline,
                              const std::atomic<bool>* cancelled) {
  absl::MutexLock lock(&mu_);
  if (!available_) return absl::UnavailableError("mer-compute is not available");
  if (queue_.empty() && running_ < max_sequences_ && kv_reserved_ + kv_tokens <= kv_budget_) {
    ++running_;  // nobody waits and it fits: no queueing (max_queue bounds only the waiting)
    kv_reserved_ += kv_tokens;
    return absl::OkStatus();
  }
  if (static_cast<int>(queue_.size()) >= options_.max_queue)
    return absl::ResourceExhaustedError(absl::StrCat("the queue is full (", queue_.size(), " requests waiting)"));
  const Waiter me{priority, next_order_++};
  queue_.insert(me);
  const uint64_t epoch = epoch_;
  auto is_cancelled = [cancelled] { return cancelled != nullptr && cancelled->load(); };
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return epoch_ != epoch || is_cancelled() ||
           (queue_.begin()->order == me.order && running_ < max_sequences_ && kv_reserved_ + kv_tokens <= kv_budget_);
  };
  absl::Status status;
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    status = absl::DeadlineExceededError("deadline exceeded while queued");
  } else if (epoch_ != epoch) {
    status = absl::UnavailableError("mer-compute went away while the request was queued");
  } else if (is_cancelled()) {
    status = absl::CancelledError("cancelled while queued");
  } else {
    ++running_;
    kv_reserved_ += kv_tokens;
  }
  queue_.erase(me);
  return status;
}

void Scheduler::Release(int64_t kv_tokens) {
  absl::MutexLock lock(&mu_);
  --running_;
  kv_reserved_ -= kv_tokens;
}

void Scheduler::Poke() { absl::MutexLock lock(&mu_); }

int Scheduler::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

int Scheduler::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

double Scheduler::kv_usage() const {
  absl::MutexLock lock(&mu_);
  return kv_budget_ > 0 ? static_cast<double>(kv_reserved_) / kv_budget_ : 0.0;
}

}  // namespace mer::gateway
