#include "services/residency/policy/lru_policy.h"

#include "common/base/check.h"

namespace mer::residency {

LruPolicy::LruPolicy(int64_t capacity) : ReplacementPolicy(capacity), pool_(capacity) { index_.reserve(capacity); }

void LruPolicy::Touch(ExpertKey key) {
  auto it = index_.find(key);
  CHECK_MSG(it != index_.end(), "Touch of a key that is not resident");
  list_.MoveToFront(pool_.nodes(), it->second);
}

void LruPolicy::Insert(ExpertKey key, bool prefetched) {
  CHECK_MSG(list_.size() < capacity(), "Admit into a full policy");
  const uint32_t i = pool_.Allocate();
  CHECK_MSG(index_.emplace(key, i).second, "Admit of a resident key");
  pool_[i].key = key;
  if (prefetched)
    list_.PushBack(pool_.nodes(), i);
  else
    list_.PushFront(pool_.nodes(), i);
}

bool LruPolicy::Remove(ExpertKey key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const uint32_t i = it->second;
  index_.erase(it);
  list_.Unlink(pool_.nodes(), i);
  pool_.Free(i);
  return true;
}

std::optional<ExpertKey> LruPolicy::DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable,
                                                   ExpertKey /*incoming*/) {
  for (uint32_t i = list_.back(); i != kNilIndex; i = pool_[i].prev) {
    if (evictable(pool_[i].key)) return pool_[i].key;
  }
  return std::nullopt;
}

std::vector<ExpertKey> LruPolicy::ResidentKeys() const {
  std::vector<ExpertKey> keys;
  keys.reserve(list_.size());
  for (uint32_t i = list_.front(); i != kNilIndex; i = pool_[i].next) keys.push_back(pool_[i].key);
  return keys;
}

}  // namespace mer::residency
