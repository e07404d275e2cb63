// Least frequently used with ageing. Each resident key has a reference count (Admit counts 1, each
// Touch 1, AdmitPrefetched 0); the victim is the evictable key of the lowest count, the least
// recently counted among equals. Every `halve_every` references all counts are halved, so experts
// that were popular long ago give way to the ones popular now.
//
// Counts of evicted keys are remembered (a bounded history), so a key that comes back resumes its
// aged count instead of starting at 1; without it (history_limit = 0, classic in-cache LFU) a
// newly popular key is evicted before its second reference and never gets established.
//
// Structure: keys sit in buckets of equal count, buckets in a list of ascending count (the O(1)
// LFU of Shah, Mitra and Matani), so Touch and Remove are O(1), ChooseVictim is O(1 + skipped
// pinned keys), Admit is O(number of distinct counts below the key's count) and the halving is
// O(capacity + history) every halve_every references.
#pragma once

#include "absl/container/flat_hash_map.h"
#include "common/base/index_list.h"
#include "services/residency/policy/replacement_policy.h"

namespace mer::residency {

struct LfuOptions {
  // References (Touch, Admit) between halvings of every count; 0: 16 x capacity.
  int64_t halve_every = 0;
  // Evicted keys whose counts are remembered; -1: 8 x capacity; 0: none.
  int64_t history_limit = -1;
};

class LfuPolicy final : public ReplacementPolicy {
 public:
  explicit LfuPolicy(int64_t capacity, const LfuOptions& options = {});

  absl::string_view name() const override { return "lfu"; }
  int64_t size() const override { return static_cast<int64_t>(index_.size()); }
  bool Contains(ExpertKey key) const override { return index_.contains(key); }
  void Touch(ExpertKey key) override;
  void Admit(ExpertKey key) override { Insert(key, /*reference=*/true); }
  void AdmitPrefetched(ExpertKey key) override { Insert(key, /*reference=*/false); }
  bool Remove(ExpertKey key) override;
  std::vector<ExpertKey> ResidentKeys() const override;

  // The count of a resident key, or the remembered count of an evicted one (0 if none): tests.
  uint32_t CountOf(ExpertKey key) const;
  int64_t halve_every() const { return halve_every_; }
  int64_t history_size() const { return static_cast<int64_t>(history_.size()); }

 protected:
  std::optional<ExpertKey> DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable, ExpertKey incoming) override;

 private:
  struct Item {
    ExpertKey key = kNoKey;
    uint32_t count = 0;
    uint32_t bucket = kNilIndex;
    uint32_t prev = kNilIndex;
    uint32_t next = kNilIndex;
  };
  struct Bucket {
    uint32_t count = 0;
    IndexList<Item> items;  // front = most recently counted
    uint32_t prev = kNilIndex;
    uint32_t next = kNilIndex;
  };

  void Insert(ExpertKey key, bool reference);
  uint32_t NewBucket(uint32_t count);
  void FreeBucketIfEmpty(uint32_t b);
  void Reference();
  void Age();

  const int64_t halve_every_;
  const int64_t history_limit_;
  int64_t references_ = 0;
  NodePool<Item> items_;
  NodePool<Bucket> buckets_;
  IndexList<Bucket> order_;  // front = lowest count
  absl::flat_hash_map<ExpertKey, uint32_t> index_;
  absl::flat_hash_map<ExpertKey, uint32_t> history_;
  std::vector<uint32_t> scratch_;  // Age's item order
};

}  // namespace mer::residency
