#include "services/residency/policy/lfu_policy.h"

#include <algorithm>

#include "common/base/check.h"

namespace mer::residency {

namespace {
constexpr uint32_t kMaxCount = 1u << 30;
}  // namespace

LfuPolicy::LfuPolicy(int64_t capacity, const LfuOptions& options)
    : ReplacementPolicy(capacity),
      halve_every_(options.halve_every > 0 ? options.halve_every : 16 * capacity),
      history_limit_(options.history_limit >= 0 ? options.history_limit : 8 * capacity),
      items_(capacity),
      buckets_(capacity + 1) {
  index_.reserve(capacity);
  history_.reserve(std::min<int64_t>(history_limit_, 1 << 16));  // grows beyond on demand
  scratch_.reserve(capacity);
}

uint32_t LfuPolicy::NewBucket(uint32_t count) {
  const uint32_t b = buckets_.Allocate();
  buckets_[b].count = count;
  buckets_[b].items.Clear();
  return b;
}

void LfuPolicy::FreeBucketIfEmpty(uint32_t b) {
  if (!buckets_[b].items.empty()) return;
  order_.Unlink(buckets_.nodes(), b);
  buckets_.Free(b);
}

void LfuPolicy::Reference() {
  if (++references_ >= halve_every_) {
    references_ = 0;
    Age();
  }
}

void LfuPolicy::Touch(ExpertKey key) {
  auto it = index_.find(key);
  CHECK_MSG(it != index_.end(), "Touch of a key that is not resident");
  const uint32_t i = it->second;
  Item& item = items_[i];
  const uint32_t b = item.bucket;
  const uint32_t count = std::min(item.count + 1, kMaxCount);
  if (count != item.count) {
    uint32_t nb = buckets_[b].next;
    if (nb == kNilIndex || buckets_[nb].count != count) {
      nb = NewBucket(count);
      order_.InsertAfter(buckets_.nodes(), b, nb);
    }
    buckets_[b].items.Unlink(items_.nodes(), i);
    buckets_[nb].items.PushFront(items_.nodes(), i);
    item.bucket = nb;
    item.count = count;
    FreeBucketIfEmpty(b);
  } else {
    buckets_[b].items.MoveToFront(items_.nodes(), i);
  }
  Reference();
}

void LfuPolicy::Insert(ExpertKey key, bool reference) {
  CHECK_MSG(size() < capacity(), "Admit into a full policy");
  CHECK_MSG(!index_.contains(key), "Admit of a resident key");
  uint32_t count = reference ? 1 : 0;
  if (auto h = history_.find(key); h != history_.end()) {
    count = std::min(h->second + count, kMaxCount);
    history_.erase(h);
  }
  const uint32_t i = items_.Allocate();
  index_.emplace(key, i);
  Item& item = items_[i];
  item.key = key;
  item.count = count;
  // The first bucket whose count is >= count.
  uint32_t b = order_.front();
  while (b != kNilIndex && buckets_[b].count < count) b = buckets_[b].next;
  if (b == kNilIndex || buckets_[b].count != count) {
    const uint32_t nb = NewBucket(count);
    if (b == kNilIndex)
      order_.PushBack(buckets_.nodes(), nb);
    else
      order_.InsertBefore(buckets_.nodes(), b, nb);
    b = nb;
  }
  buckets_[b].items.PushFront(items_.nodes(), i);
  item.bucket = b;
  if (reference) Reference();
}

bool LfuPolicy::Remove(ExpertKey key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const uint32_t i = it->second;
  index_.erase(it);
  Item& item = items_[i];
  buckets_[item.bucket].items.Unlink(items_.nodes(), i);
  FreeBucketIfEmpty(item.bucket);
  if (item.count > 0 && static_cast<int64_t>(history_.size()) < history_limit_) history_[key] = item.count;
  item.bucket = kNilIndex;
  items_.Free(i);
  return true;
}

void LfuPolicy::Age() {
  // Items in eviction order: ascending count, least recent first within a count.
  scratch_.clear();
  for (uint32_t b = order_.front(); b != kNilIndex;) {
    const uint32_t next = buckets_[b].next;
    for (uint32_t i = buckets_[b].items.back(); i != kNilIndex; i = items_[i].prev) scratch_.push_back(i);
    buckets_.Free(b);
    b = next;
  }
  order_.Clear();
  // Halving keeps the order; buckets whose halves are equal merge, the lower count's keys behind.
  for (uint32_t i : scratch_) {
    Item& item = items_[i];
    item.count >>= 1;
    uint32_t b = order_.back();
    if (b == kNilIndex || buckets_[b].count != item.count) {
      b = NewBucket(item.count);
      order_.PushBack(buckets_.nodes(), b);
    }
    buckets_[b].items.PushFront(items_.nodes(), i);
    item.bucket = b;
  }
  for (auto it = history_.begin(); it != history_.end();) {
    it->second >>= 1;
    if (it->second == 0)
      history_.erase(it++);
    else
      ++it;
  }
}

std::optional<ExpertKey> LfuPolicy::DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable,
                                                   ExpertKey /*incoming*/) {
  for (uint32_t b = order_.front(); b != kNilIndex; b = buckets_[b].next) {
    for (uint32_t i = buckets_[b].items.back(); i != kNilIndex; i = items_[i].prev) {
      if (evictable(items_[i].key)) return items_[i].key;
    }
  }
  return std::nullopt;
}

std::vector<ExpertKey> LfuPolicy::ResidentKeys() const {
  std::vector<ExpertKey> keys;
  keys.reserve(index_.size());
  for (uint32_t b = order_.back(); b != kNilIndex; b = buckets_[b].prev) {
    for (uint32_t i = buckets_[b].items.front(); i != kNilIndex; i = items_[i].next) keys.push_back(items_[i].key);
  }
  return keys;
}

uint32_t LfuPolicy::CountOf(ExpertKey key) const {
  if (auto it = index_.find(key); it != index_.end()) return items_[it->second].count;
  if (auto h = history_.find(key); h != history_.end()) return h->second;
  return 0;
}

}  // namespace mer::residency
