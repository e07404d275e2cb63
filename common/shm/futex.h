// Process-shared futex wait/wake on a 32-bit word in a MAP_SHARED mapping (not FUTEX_PRIVATE: the
// kernel keys the wait queue by the backing page, so two processes mapping the segment at
// different addresses meet on the same queue). No lock is ever held across a wait, so a peer that
// dies at any point cannot leave the other blocked beyond its timeout.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace mer::shm {

// Sleeps while *word == expected, for at most `timeout` (a negative or zero timeout returns at
// once). Returns on a wake, a timeout, a signal or a changed value: callers always re-check their
// condition; spurious returns are allowed.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout);

// Wakes every waiter on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word);

// CLOCK_MONOTONIC in nanoseconds (shared by all processes of the host; what heartbeats use).
uint64_t MonotonicNanos();

}  // namespace mer::shm
