// Least recently used: one intrusive list, front = most recent. Every operation is O(1) except
// ChooseVictim, which walks from the back past keys that are not evictable (O(1 + pinned)).
#pragma once

#include "absl/container/flat_hash_map.h"
#include "common/base/index_list.h"
#include "services/residency/policy/replacement_policy.h"

namespace mer::residency {

class LruPolicy final : public ReplacementPolicy {
 public:
  explicit LruPolicy(int64_t capacity);

  absl::string_view name() const override { return "lru"; }
  int64_t size() const override { return list_.size(); }
  bool Contains(ExpertKey key) const override { return index_.contains(key); }
  void Touch(ExpertKey key) override;
  void Admit(ExpertKey key) override { Insert(key, /*prefetched=*/false); }
  // A prefetched key enters at the eviction end: a right guess is touched (and moved to the
  // front) by the layer that wanted it, a wrong one is the first to go.
  void AdmitPrefetched(ExpertKey key) override { Insert(key, /*prefetched=*/true); }
  bool Remove(ExpertKey key) override;
  std::vector<ExpertKey> ResidentKeys() const override;

 protected:
  std::optional<ExpertKey> DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable, ExpertKey incoming) override;

 private:
  void Insert(ExpertKey key, bool prefetched);

  struct Node {
    ExpertKey key = kNoKey;
    uint32_t prev = kNilIndex;
    uint32_t next = kNilIndex;
  };
  NodePool<Node> pool_;
  IndexList<Node> list_;
  absl::flat_hash_map<ExpertKey, uint32_t> index_;
};

}  // namespace mer::residency
