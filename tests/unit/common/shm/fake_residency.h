// A minimal mer-residency for the shm tests: answers DemandRequests by "loading" the expert into a
// RAM slot (a byte pattern derived from (layer, expert)), evicting with the R1-R3 protocol of
// residency_table.h when the pool is full, and completing with DataLoss for one chosen expert.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/shm/client.h"
#include "common/shm/segment.h"

namespace mer::shm::testing {

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t PatternWord(uint32_t layer, uint32_t expert, size_t i) {
  return Mix((uint64_t{layer} << 32 | expert) * 1000003 + i);
}

inline void FillPattern(absl::Span<uint8_t> bytes, uint32_t layer, uint32_t expert) {
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t w = PatternWord(layer, expert, i / 8);
    std::memcpy(bytes.data() + i, &w, 8);
  }
}

inline bool CheckPattern(absl::Span<const uint8_t> bytes, uint32_t layer, uint32_t expert) {
  if (bytes.empty()) return false;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    if (w != PatternWord(layer, expert, i / 8)) return false;
  }
  return true;
}

struct FakeResidencyOptions {
  int fail_layer = -1;  // (fail_layer, fail_expert) completes with DataLoss
  int fail_expert = -1;
  bool churn = false;  // after each load, also evict one other resident expert
};

class FakeResidency {
 public:
  FakeResidency(ShmSegment* segment, FakeResidencyOptions options = {})
      : ep_(segment), options_(options), owner_(segment->header().ram_slot_count, kFree) {}

  // Handles every pending demand it can; returns how many messages it handled.
  size_t Poll() {
    size_t handled = FlushCompletions();
    DemandRequest buf[64];
    const size_t n = ep_.demand().PopBatch(absl::MakeSpan(buf));
    for (size_t i = 0; i < n; ++i) deferred_.push_back(buf[i]);
    const size_t todo = deferred_.size();
    for (size_t i = 0; i < todo; ++i) {
      DemandRequest d = deferred_.front();
      deferred_.pop_front();
      if (!Handle(d)) deferred_.push_back(d);  // no reusable slot yet
    }
    handled += n;
    FlushCompletions();
    return handled;
  }

  void Run(const std::atomic<bool>& stop) {
    while (!stop.load(std::memory_order_relaxed)) {
      if (Poll() == 0) ep_.demand().WaitForData(absl::Milliseconds(deferred_.empty() ? 2 : 0.05));
    }
  }

  uint64_t loads() const { return loads_; }
  uint64_t evictions() const { return evictions_; }
  ResidencyEndpoint& endpoint() { return ep_; }

 private:
  static constexpr uint64_t kFree = ~0ull;
  static uint64_t Key(uint32_t l, uint32_t e) { return uint64_t{l} << 32 | e; }

  bool Handle(const DemandRequest& d) {
    ShmSegment& seg = ep_.segment();
    if (!ep_.table().Contains(d.layer, d.expert)) return true;  // hostile input: dropped
    Completion c{};
    c.layer = d.layer;
    c.expert = d.expert;
    c.request_id = d.request_id;
    c.pool = static_cast<uint8_t>(Pool::kRam);
    if (static_cast<int>(d.layer) == options_.fail_layer && static_cast<int>(d.expert) == options_.fail_expert) {
      c.generation = ep_.PublishFailed(d.layer, d.expert, absl::StatusCode::kDataLoss);
      c.status = static_cast<uint16_t>(absl::StatusCode::kDataLoss);
      c.slot = kNoSlot;
      out_.push_back(c);
      return true;
    }
    const std::optional<EntryState> s = ep_.table().Read(d.layer, d.expert);
    if (s.has_value() && s->in(Pool::kRam)) {
      c.slot = s->ram_slot;
      c.generation = s->generation;
      out_.push_back(c);
      return true;
    }
    const int slot = FindSlot();
    if (slot < 0) return false;
    FillPattern(seg.ram_slot(slot), d.layer, d.expert);
    owner_[slot] = Key(d.layer, d.expert);
    c.slot = static_cast<uint32_t>(slot);
    c.generation = ep_.PublishResident(d.layer, d.expert, c.slot);
    ++loads_;
    out_.push_back(c);
    if (options_.churn) {
      // Evict some other expert right away; its slot is reused once unpinned.
      for (size_t i = 0; i < owner_.size(); ++i) {
        const size_t k = (hand_ + i) % owner_.size();
        if (static_cast<int>(k) != slot && owner_[k] != kFree) {
          ep_.EvictRam(static_cast<uint32_t>(owner_[k] >> 32), static_cast<uint32_t>(owner_[k]));
          owner_[k] = kFree;
          ++evictions_;
          hand_ = k + 1;
          break;
        }
      }
    }
    return true;
  }

  // A slot no step can read: free, or one whose expert is evicted here (R1) and unpinned (R3).
  int FindSlot() {
    const size_t n = owner_.size();
    for (size_t i = 0; i < n; ++i) {
      const size_t k = (hand_ + i) % n;
      if (owner_[k] == kFree && ep_.SlotReusable(Pool::kRam, static_cast<uint32_t>(k))) {
        hand_ = k + 1;
        return static_cast<int>(k);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      const size_t k = (hand_ + i) % n;
      if (owner_[k] == kFree) continue;
      ep_.EvictRam(static_cast<uint32_t>(owner_[k] >> 32), static_cast<uint32_t>(owner_[k]));
      owner_[k] = kFree;
      ++evictions_;
      if (ep_.SlotReusable(Pool::kRam, static_cast<uint32_t>(k))) {
        hand_ = k + 1;
        return static_cast<int>(k);
      }
    }
    return -1;
  }

  size_t FlushCompletions() {
    size_t pushed = 0;
    while (!out_.empty()) {
      std::vector<Completion> v(out_.begin(), out_.end());
      const size_t k = ep_.completions().TryPushBatch(v);
      out_.erase(out_.begin(), out_.begin() + k);
      pushed += k;
      if (k < v.size()) break;
    }
    return pushed;
  }

  ResidencyEndpoint ep_;
  FakeResidencyOptions options_;
  std::vector<uint64_t> owner_;  // per RAM slot: Key of the expert in it, or kFree
  size_t hand_ = 0;
  std::deque<DemandRequest> deferred_;
  std::deque<Completion> out_;
  uint64_t loads_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace mer::shm::testing
