#include "services/residency/policy/arc_policy.h"

#include <algorithm>

#include "common/base/check.h"

namespace mer::residency {

ArcPolicy::ArcPolicy(int64_t capacity) : ReplacementPolicy(capacity), pool_(2 * capacity + 1) {
  index_.reserve(2 * capacity + 1);
}

ArcPolicy::ListId ArcPolicy::ListOf(ExpertKey key) const {
  auto it = index_.find(key);
  return it == index_.end() ? kNone : static_cast<ListId>(pool_[it->second].list);
}

bool ArcPolicy::Contains(ExpertKey key) const {
  const ListId l = ListOf(key);
  return l == kT1 || l == kT2;
}

void ArcPolicy::Move(uint32_t node, ListId to) {
  Node& n = pool_[node];
  lists_[n.list].Unlink(pool_.nodes(), node);
  n.list = to;
  lists_[to].PushFront(pool_.nodes(), node);
}

void ArcPolicy::DropLru(ListId list) {
  const uint32_t i = lists_[list].back();
  CHECK(i != kNilIndex);
  lists_[list].Unlink(pool_.nodes(), i);
  index_.erase(pool_[i].key);
  pool_[i].list = kNone;
  pool_.Free(i);
}

double ArcPolicy::AdaptedTarget(ExpertKey incoming) const {
  const double b1 = static_cast<double>(lists_[kB1].size());
  const double b2 = static_cast<double>(lists_[kB2].size());
  switch (ListOf(incoming)) {
    case kB1:
      return std::min(static_cast<double>(capacity()), p_ + std::max(1.0, b2 / b1));
    case kB2:
      return std::max(0.0, p_ - std::max(1.0, b1 / b2));
    default:
      return p_;
  }
}

void ArcPolicy::Touch(ExpertKey key) {
  auto it = index_.find(key);
  CHECK_MSG(it != index_.end(), "Touch of a key that is not resident");
  const uint32_t i = it->second;
  Node& n = pool_[i];
  CHECK_MSG(n.list == kT1 || n.list == kT2, "Touch of a ghost key");
  if (n.prefetched) {  // its first reference
    n.prefetched = false;
    Move(i, kT1);
  } else {
    Move(i, kT2);
  }
}

void ArcPolicy::Insert(ExpertKey key, bool prefetched) {
  const int64_t c = capacity();
  CHECK_MSG(size() < c, "Admit into a full policy");
  auto it = index_.find(key);
  if (it != index_.end()) {
    const uint32_t i = it->second;
    const ListId l = static_cast<ListId>(pool_[i].list);
    CHECK_MSG(l == kB1 || l == kB2, "Admit of a resident key");
    if (!prefetched) {  // a ghost hit: adapt, and the key has now been referenced twice
      p_ = pending_key_ == key ? pending_p_ : AdaptedTarget(key);
      pending_key_ = kNoKey;
      Move(i, kT2);
      return;
    }
    // A prefetch is no reference: the key starts over in T1.
    lists_[l].Unlink(pool_.nodes(), i);
    index_.erase(it);
    pool_[i].list = kNone;
    pool_.Free(i);
  }
  pending_key_ = kNoKey;
  // Case IV of the paper: bound the directory at |T1| + |B1| <= c and everything at 2c.
  while (lists_[kT1].size() + lists_[kB1].size() >= c && !lists_[kB1].empty()) DropLru(kB1);
  while (size() + lists_[kB1].size() + lists_[kB2].size() >= 2 * c) {
    if (!lists_[kB2].empty())
      DropLru(kB2);
    else if (!lists_[kB1].empty())
      DropLru(kB1);
    else
      break;
  }
  const uint32_t i = pool_.Allocate();
  Node& n = pool_[i];
  n.key = key;
  n.list = kT1;
  n.prefetched = prefetched;
  index_.emplace(key, i);
  // A prefetched key waits at T1's eviction end until a reference moves it up.
  if (prefetched)
    lists_[kT1].PushBack(pool_.nodes(), i);
  else
    lists_[kT1].PushFront(pool_.nodes(), i);
}

bool ArcPolicy::Remove(ExpertKey key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const uint32_t i = it->second;
  Node& n = pool_[i];
  if (n.list != kT1 && n.list != kT2) return false;
  if (n.prefetched) {  // never referenced: nothing to remember
    lists_[n.list].Unlink(pool_.nodes(), i);
    index_.erase(it);
    n.list = kNone;
    n.prefetched = false;
    pool_.Free(i);
    return true;
  }
  Move(i, n.list == kT1 ? kB1 : kB2);
  return true;
}

std::optional<ExpertKey> ArcPolicy::DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable, ExpertKey incoming) {
  const double p = AdaptedTarget(incoming);
  pending_key_ = incoming;
  pending_p_ = p;
  const double t1 = static_cast<double>(lists_[kT1].size());
  const bool from_t1 = t1 >= 1 && (t1 > p || (ListOf(incoming) == kB2 && t1 >= p));
  for (ListId l : {from_t1 ? kT1 : kT2, from_t1 ? kT2 : kT1}) {
    for (uint32_t i = lists_[l].back(); i != kNilIndex; i = pool_[i].prev) {
      if (evictable(pool_[i].key)) return pool_[i].key;
    }
  }
  return std::nullopt;
}

std::vector<ExpertKey> ArcPolicy::ResidentKeys() const {
  std::vector<ExpertKey> keys;
  keys.reserve(size());
  for (ListId l : {kT2, kT1}) {
    for (uint32_t i = lists_[l].front(); i != kNilIndex; i = pool_[i].next) keys.push_back(pool_[i].key);
  }
  return keys;
}

}  // namespace mer::residency
