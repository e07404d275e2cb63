// Single-producer single-consumer ring of fixed-size messages in shared memory.
//
// A ring is a RingControl (layout.h) followed by `capacity` slots of T; capacity is a power of two
// taken from the validated header, never from shared memory. head and tail count the items ever
// pushed and popped (uint64, monotonically increasing; position p lives in slot p & (capacity-1)).
// head is on its own cache line, written by the producer only; tail on another, written by the
// consumer only; each side keeps a private copy of the other's counter and refreshes it only when
// the ring looks full (producer) or empty (consumer), so the steady state moves one cache line per
// batch in each direction.
//
// Thread safety
// -------------
// At most one RingProducer and one RingConsumer per ring at a time, in any processes. Neither
// needs a lock, and neither blocks the other: a process killed at any instruction leaves the ring
// in a state the other side, and a restarted replacement, can continue from.
//
// Invariants (with head and tail the values in shared memory)
// ----------
// (1) tail <= head <= tail + capacity.
// (2) Slots of positions [tail, head) hold published items and belong to the consumer; slots of
//     positions [head, tail + capacity) belong to the producer. Only the owner touches a slot.
// (3) Publication: the producer writes the slot of position p, then stores head = p + 1 with
//     release order; the consumer loads head with acquire order before reading that slot, so it
//     reads the item completely written.
// (4) Release: the consumer copies the slot out, then stores tail = p + 1 with release order;
//     the producer loads tail with acquire order before it overwrites the slot, so the consumer's
//     read happens before the overwrite.
// (5) A crash of the producer between (3)'s slot write and head store loses that item (it was
//     never published); a restarted producer starts at the head it finds. A crash of the consumer
//     between (4)'s copy and tail store delivers the item again to a restarted consumer. Across a
//     restart the ring is therefore at-least-once for the consumer and at-most-once for the
//     producer; with both alive it is exactly-once and in order.
// (6) A ring whose counters violate (1) (a corrupt or hostile peer) is reported by corrupted()
//     and never indexed out of bounds: slot indices are always masked.
//
// Wake-ups (no lock, bounded sleeps)
// --------
// The consumer sleeps on data_futex, the producer (when the ring is full) on space_futex.
// Sleeper:  waiting = 1; fence(seq_cst); seen = futex.load(acquire); re-check the ring;
//           FutexWait(futex, seen, timeout); waiting = 0.
// Waker:    publish (head or tail store); fence(seq_cst); if (waiting) { futex.fetch_add(release);
//           FutexWakeAll(futex); }
// The two fences make it impossible for the waker to miss waiting == 1 while the sleeper misses
// the publication; if the waker bumps the futex before the sleeper reads `seen`, the acquire/
// release pair on the futex word makes the re-check see the publication; if after, FutexWait's
// value check or the wake ends the sleep. A wake that finds the ring unchanged (a late bump for a
// publication already consumed, a signal) sleeps again for the rest of the timeout, so the waits
// return false only once the timeout has passed. Every sleep is bounded by the caller's timeout, so
// a dead peer (which will never wake anyone) costs at most one timeout, after which the caller
// checks the peer's liveness (segment.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/shm/futex.h"
#include "common/shm/layout.h"

namespace mer::shm {

template <typename T>
struct RingRegion {
  RingControl* control = nullptr;
  T* slots = nullptr;
  uint32_t capacity = 0;  // power of two
};

namespace ring_internal {

inline void Notify(std::atomic<uint32_t>& futex, std::atomic<uint32_t>& waiting) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (waiting.load(std::memory_order_relaxed) != 0) {
    futex.fetch_add(1, std::memory_order_release);
    FutexWakeAll(&futex);
  }
}

// Sleeps until `ready()` or the timeout; returns ready(). A wake that finds nothing (a late bump
// for a publication already consumed, a signal) sleeps again for the rest of the timeout.
template <typename Ready>
bool Wait(std::atomic<uint32_t>& futex, std::atomic<uint32_t>& waiting, absl::Duration timeout, Ready ready) {
  if (ready()) return true;
  if (timeout <= absl::ZeroDuration()) return false;
  const uint64_t end = MonotonicNanos() + static_cast<uint64_t>(absl::ToInt64Nanoseconds(timeout));
  for (;;) {
    waiting.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    const uint32_t seen = futex.load(std::memory_order_acquire);
    const bool now_ready = ready();
    const uint64_t now = MonotonicNanos();
    if (!now_ready && now < end) FutexWait(&futex, seen, absl::Nanoseconds(end - now));
    waiting.store(0, std::memory_order_relaxed);
    if (now_ready || ready()) return true;
    if (MonotonicNanos() >= end) return false;
  }
}

}  // namespace ring_internal

template <typename T>
class RingProducer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  RingProducer() = default;
  explicit RingProducer(const RingRegion<T>& region)
      : c_(region.control), slots_(region.slots), capacity_(region.capacity), mask_(region.capacity - 1) {
    // The previous producer (maybe a dead process) left head where its last publication was.
    head_ = c_->head.load(std::memory_order_acquire);
    cached_tail_ = c_->tail.load(std::memory_order_acquire);
    c_->producer_waiting.store(0, std::memory_order_relaxed);
  }

  bool valid() const { return c_ != nullptr; }
  uint32_t capacity() const { return capacity_; }

  // Pushes `item` unless the ring is full.
  bool TryPush(const T& item) { return TryPushBatch(absl::MakeConstSpan(&item, 1)) == 1; }

  // Pushes the longest prefix of `items` that fits; returns its length. One head store and at most
  // one wake for the whole batch.
  size_t TryPushBatch(absl::Span<const T> items) {
    if (items.empty()) return 0;
    uint64_t free = Free(false);
    if (free < items.size()) free = Free(true);
    const size_t n = std::min<uint64_t>(free, items.size());
    if (n == 0) return 0;
    for (size_t i = 0; i < n; ++i) std::memcpy(&slots_[(head_ + i) & mask_], &items[i], sizeof(T));
    head_ += n;
    c_->head.store(head_, std::memory_order_release);  // invariant (3)
    ring_internal::Notify(c_->data_futex, c_->consumer_waiting);
    return n;
  }

  // Waits until at least one slot is free, for at most `timeout`. Returns whether one is.
  bool WaitForSpace(absl::Duration timeout) {
    return ring_internal::Wait(c_->space_futex, c_->producer_waiting, timeout, [this] { return Free(true) > 0; });
  }

  // Items pushed and not yet popped, as the producer sees it now.
  uint64_t SizeApprox() { return capacity_ - Free(true); }
  uint64_t pushed() const { return head_; }
  bool corrupted() const { return corrupted_; }

 private:
  uint64_t Free(bool refresh) {
    if (refresh) cached_tail_ = c_->tail.load(std::memory_order_acquire);  // invariant (4)
    const uint64_t used = head_ - cached_tail_;
    if (cached_tail_ > head_ || used > capacity_) {  // invariant (1) broken by the peer
      corrupted_ = true;
      return 0;
    }
    return capacity_ - used;
  }

  RingControl* c_ = nullptr;
  T* slots_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t mask_ = 0;
  uint64_t head_ = 0;         // ours: only this producer writes head
  uint64_t cached_tail_ = 0;  // last tail read
  bool corrupted_ = false;
};

template <typename T>
class RingConsumer {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  RingConsumer() = default;
  explicit RingConsumer(const RingRegion<T>& region)
      : c_(region.control), slots_(region.slots), capacity_(region.capacity), mask_(region.capacity - 1) {
    tail_ = c_->tail.load(std::memory_order_acquire);
    cached_head_ = c_->head.load(std::memory_order_acquire);
    c_->consumer_waiting.store(0, std::memory_order_relaxed);
  }

  bool valid() const { return c_ != nullptr; }
  uint32_t capacity() const { return capacity_; }

  bool TryPop(T* out) { return PopBatch(absl::MakeSpan(out, 1)) == 1; }

  // Pops up to out.size() items in order; returns how many. One tail store per batch.
  size_t PopBatch(absl::Span<T> out) {
    if (out.empty()) return 0;
    uint64_t avail = Available(false);
    if (avail < out.size()) avail = Available(true);
    const size_t n = std::min<uint64_t>(avail, out.size());
    if (n == 0) return 0;
    for (size_t i = 0; i < n; ++i) std::memcpy(&out[i], &slots_[(tail_ + i) & mask_], sizeof(T));
    tail_ += n;
    c_->tail.store(tail_, std::memory_order_release);  // invariant (4)
    ring_internal::Notify(c_->space_futex, c_->producer_waiting);
    return n;
  }

  // Waits until at least one item is available, for at most `timeout`. Returns whether one is.
  bool WaitForData(absl::Duration timeout) {
    return ring_internal::Wait(c_->data_futex, c_->consumer_waiting, timeout, [this] { return Available(true) > 0; });
  }

  uint64_t SizeApprox() { return Available(true); }
  uint64_t popped() const { return tail_; }
  bool corrupted() const { return corrupted_; }

 private:
  uint64_t Available(bool refresh) {
    if (refresh) cached_head_ = c_->head.load(std::memory_order_acquire);  // invariant (3)
    const uint64_t avail = cached_head_ - tail_;
    if (cached_head_ < tail_ || avail > capacity_) {  // invariant (1) broken by the peer
      corrupted_ = true;
      return 0;
    }
    return avail;
  }

  RingControl* c_ = nullptr;
  T* slots_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t mask_ = 0;
  uint64_t tail_ = 0;         // ours: only this consumer writes tail
  uint64_t cached_head_ = 0;  // last head read
  bool corrupted_ = false;
};

}  // namespace mer::shm
