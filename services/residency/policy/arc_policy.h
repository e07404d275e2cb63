// Adaptive Replacement Cache (Megiddo and Modha, FAST 2003). Resident keys are split between T1
// (referenced once since they came in) and T2 (referenced again); the ghost lists B1 and B2
// remember keys recently evicted from each, without data. A miss on a key in B1 means T1 was too
// small, one in B2 that T2 was: the target size p of T1 moves accordingly, and the victim is taken
// from T1 when |T1| exceeds p, else from T2, least recently used first. A scan of keys used once
// passes through T1 without displacing T2, which is what makes ARC scan-resistant where LRU is not.
//
// Adapted to this interface: the paper's REPLACE happens in ChooseVictim (which computes the
// adapted p for `incoming` without committing it), the move into T2 and the adaptation in Admit;
// pinned keys are skipped, and the other list is used when the preferred one holds only pinned
// keys. A prefetched key enters T1 at its eviction end, and its first Touch moves it to T1's front
// (that Touch is its first reference), so a wrong guess goes first; removed without ever being
// touched, it is forgotten rather than made a ghost.
// Every operation is O(1) except ChooseVictim's walk past pinned keys.
#pragma once

#include "absl/container/flat_hash_map.h"
#include "common/base/index_list.h"
#include "services/residency/policy/replacement_policy.h"

namespace mer::residency {

class ArcPolicy final : public ReplacementPolicy {
 public:
  explicit ArcPolicy(int64_t capacity);

  absl::string_view name() const override { return "arc"; }
  int64_t size() const override { return lists_[kT1].size() + lists_[kT2].size(); }
  bool Contains(ExpertKey key) const override;
  void Touch(ExpertKey key) override;
  void Admit(ExpertKey key) override { Insert(key, /*prefetched=*/false); }
  void AdmitPrefetched(ExpertKey key) override { Insert(key, /*prefetched=*/true); }
  bool Remove(ExpertKey key) override;
  std::vector<ExpertKey> ResidentKeys() const override;

  // Introspection for tests.
  double target_t1() const { return p_; }
  int64_t t1_size() const { return lists_[kT1].size(); }
  int64_t t2_size() const { return lists_[kT2].size(); }
  int64_t b1_size() const { return lists_[kB1].size(); }
  int64_t b2_size() const { return lists_[kB2].size(); }
  bool InT2(ExpertKey key) const { return ListOf(key) == kT2; }
  bool IsGhost(ExpertKey key) const { return ListOf(key) == kB1 || ListOf(key) == kB2; }

 protected:
  std::optional<ExpertKey> DoChooseVictim(absl::FunctionRef<bool(ExpertKey)> evictable, ExpertKey incoming) override;

 private:
  enum ListId : uint8_t { kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3, kNone = 4 };
  struct Node {
    ExpertKey key = kNoKey;
    uint8_t list = kNone;
    bool prefetched = false;
    uint32_t prev = kNilIndex;
    uint32_t next = kNilIndex;
  };

  ListId ListOf(ExpertKey key) const;
  double AdaptedTarget(ExpertKey incoming) const;
  void Insert(ExpertKey key, bool prefetched);
  void DropLru(ListId list);
  void Move(uint32_t node, ListId to);

  NodePool<Node> pool_;
  IndexList<Node> lists_[4];                        // front = most recent
  absl::flat_hash_map<ExpertKey, uint32_t> index_;  // keys of all four lists
  double p_ = 0;                                    // target size of T1
  ExpertKey pending_key_ = kNoKey;                  // the key ChooseVictim adapted for
  double pending_p_ = 0;
};

}  // namespace mer::residency
