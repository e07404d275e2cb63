// The gateway's admission control: a bounded queue of Generate calls, ordered by priority
// (higher first) and then arrival, in front of mer-compute's sequence slots and KV budget. The
// head of the queue is admitted when a slot is free and the KV positions it reserves
// (prompt + max_new_tokens - 1) fit the budget; nothing overtakes the head, so a large request
// is not starved by small ones. A full queue answers ResourceExhausted at once instead of
// growing.
//
// Capacity comes from mer-compute (SetCapacity, on every change of its instance); while compute
// is down (SetUnavailable) new calls and queued ones get Unavailable.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace mer::gateway {

struct SchedulerOptions {
  int max_queue = 256;  // calls waiting for admission; more get ResourceExhausted
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerOptions& options) : options_(options) {}

  // A compute instance is up with these limits. Reservations already held stay counted.
  void SetCapacity(int max_sequences, int64_t kv_budget_tokens);
  // Compute is down: every waiting call and every new one gets Unavailable until SetCapacity.
  void SetUnavailable();

  // Waits for admission. ResourceExhausted when the queue is full, DeadlineExceeded at
  // `deadline`, Cancelled once *cancelled is set (whoever sets it calls Poke), Unavailable while
  // compute is down. On OK the caller holds one slot and `kv_tokens` positions until Release.
  absl::Status Admit(int priority, int64_t kv_tokens, absl::Time deadline,
                     const std::atomic<bool>* cancelled = nullptr);
  void Release(int64_t kv_tokens);
  // Makes waiting calls look at their `cancelled` flags again.
  void Poke();

  int running() const;
  int waiting() const;
  // KV positions reserved by admitted calls, as a fraction of the budget (0 while compute is down).
  double kv_usage() const;

 private:
  struct Waiter {
    int priority;
    uint64_t order;
    bool operator<(const Waiter& o) const { return priority != o.priority ? priority > o.priority : order < o.order; }
  };

  const SchedulerOptions options_;
  mutable absl::Mutex mu_;
  std::set<Waiter> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  bool available_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;  // bumped by SetUnavailable
  int max_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t kv_budget_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t kv_reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace mer::gateway
