// Cache replacement policies for the residency tiers: which expert leaves a full tier of `capacity`
// slots when another must come in. Keys are (layer, expert) pairs packed into a uint32 (ExpertKey).
//
// A policy only orders keys; the tier owns the slots and the data. The protocol, for a lookup of key
// x in a tier of capacity c:
//   hit  (Contains(x)):            Touch(x)
//   miss, size() < c:              Admit(x)
//   miss, size() == c:             v = ChooseVictim(evictable, x); Remove(*v); Admit(x)
// A prefetched key enters with AdmitPrefetched(x): it is not counted as a reference and is placed
// to be evicted first until a Touch shows the guess was right (LRU and ARC put it at the eviction
// end, LFU gives it count 0), so a wrong guess neither displaces useful keys for long nor passes
// for a popular expert. Remove() is
// also how a key leaves for any other reason (the tier dropped it); ARC remembers removed keys in
// its ghost lists either way.
//
// ChooseVictim never returns a key for which `evictable` is false: the tier passes "not pinned",
// pinned keys being experts that a step in flight reads. It returns nullopt when every resident key
// is pinned (the caller then serves the miss without caching it). ChooseVictim does not change
// which keys are resident.
//
// Thread-safety: none; one tier, one policy, one thread (the residency daemon's cache thread).
// Memory: every structure is reserved at construction; Touch, Admit, Remove and ChooseVictim do
// not allocate in steady state (LFU's history of evicted keys is a hash map reserved for up to
// 65536 keys up front).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mer::residency {

// (layer, expert) packed as layer << 16 | expert: layers and experts below 65536.
using ExpertKey = uint32_t;
inline constexpr ExpertKey kNoKey = 0xFFFFFFFFu;
inline constexpr int kMaxKeyLayers = 1 << 16;
inline constexpr int kMaxKeyExperts = 1 << 16;

constexpr ExpertKey PackExpertKey(int layer, int expert) {
  return (static_cast<uint32_t>(layer) << 16) | static_cast<uint32_t>(expert);
}
constexpr int KeyLayer(ExpertKey key) { return static_cast<int>(key >> 16); }
constexpr int KeyExpert(ExpertKey key) { return static_cast<int>(key & 0xFFFFu); }

class ReplacementPolicy {
 public:
  // Largest capacity a policy accepts.
  static constexpr int64_t kMaxCapacity = int64_t{1} << 24;

  explicit ReplacementPolicy(int64_t capacity);
  virtual ~ReplacementPolicy() = default;
  ReplacementPolicy(const ReplacementPolicy&) = delete;
  ReplacementPolicy& operator=(const ReplacementPolicy&) = delete;

  virtual absl::string_view name() const = 0;
  int64_t capacity() const { return capacity_; }
  // Resident keys (admitted and not removed); never above capacity().
  virtual int64_t size() const = 0;
  virtual bool Contains(ExpertKey key) const = 0;

  // A hit on resident `key` (CHECK-fails when it is not resident).
  virtual void Touch(ExpertKey key) = 0;
  // `key` was inserted into a slot. CHECK: not resident, size() < capacity().
  virtual void Admit(ExpertKey key) = 0;
  // Like Admit, for a key brought in by prefetch rather than by a reference.
  virtual void AdmitPrefetched(ExpertKey key) { Admit(key); }
  // `key` left its slot. Returns false (and changes nothing) when it was not resident.
  virtual bool Remove(ExpertKey key) = 0;

  // The resident key to evict next among those `evictable` accepts; nullopt when there is none.
  // `incoming` is the key the slot is wanted for (kNoKey: unknown); ARC uses it to adapt.
  std::optional<ExpertKey> ChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable, ExpertKey incoming = kNoKey) {
    return DoChooseVictim(evictable, incoming);
  }
  // The victim when nothing is pinned.
  std::optional<ExpertKey> ChooseVictim() {
    return DoChooseVictim([](ExpertKey) { return true; }, kNoKey);
  }

  // The resident keys, best to keep first as far as the policy orders them (tests, debugging;
  // allocates).
  virtual std::vector<ExpertKey> ResidentKeys() const = 0;

 protected:
  virtual std::optional<ExpertKey> DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable, ExpertKey incoming) = 0;

 private:
  const int64_t capacity_;
};

// The policies by flag name: "lru", "lfu" (LFU with ageing, default options) and "arc".
// InvalidArgument for an unknown name or a capacity outside [1, kMaxCapacity].
absl::StatusOr<std::unique_ptr<ReplacementPolicy>> CreatePolicy(absl::string_view name, int64_t capacity);
// {"lru", "lfu", "arc"}.
const std::vector<std::string>& PolicyNames();

}  // namespace mer::residency
