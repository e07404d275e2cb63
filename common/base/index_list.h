// Doubly-linked lists threaded by index through a pool of nodes that the caller owns (a
// std::vector<Node>), so that moving an element to the front, unlinking it or inserting it next to
// another is O(1) and allocates nothing: the one list under every LRU order of mer (the replacement
// policies, mer-residency's VRAM slot map, the cuda arena's slots).
//
// A node type has `uint32_t prev, next` members; kNilIndex ends a list. A node is in at most one
// list at a time, and the list does not know which nodes are in it: calling Unlink or MoveToFront
// for a node of another list corrupts both. Front = the end PushFront inserts at; LRU users keep
// the most recent there and walk `prev` from back().
//
// Thread-safety: none; the owner of the pool serialises every call.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/check.h"

namespace mer {

inline constexpr uint32_t kNilIndex = 0xFFFFFFFFu;

template <typename Node>
class IndexList {
 public:
  uint32_t front() const { return front_; }
  uint32_t back() const { return back_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void PushFront(std::vector<Node>& pool, uint32_t i) {
    Node& n = pool[i];
    n.prev = kNilIndex;
    n.next = front_;
    if (front_ != kNilIndex) pool[front_].prev = i;
    front_ = i;
    if (back_ == kNilIndex) back_ = i;
    ++size_;
  }

  void PushBack(std::vector<Node>& pool, uint32_t i) {
    Node& n = pool[i];
    n.next = kNilIndex;
    n.prev = back_;
    if (back_ != kNilIndex) pool[back_].next = i;
    back_ = i;
    if (front_ == kNilIndex) front_ = i;
    ++size_;
  }

  // Inserts i just after `pos` (which is in this list).
  void InsertAfter(std::vector<Node>& pool, uint32_t pos, uint32_t i) {
    Node& n = pool[i];
    n.prev = pos;
    n.next = pool[pos].next;
    if (n.next != kNilIndex)
      pool[n.next].prev = i;
    else
      back_ = i;
    pool[pos].next = i;
    ++size_;
  }

  // Inserts i just before `pos` (which is in this list).
  void InsertBefore(std::vector<Node>& pool, uint32_t pos, uint32_t i) {
    Node& n = pool[i];
    n.next = pos;
    n.prev = pool[pos].prev;
    if (n.prev != kNilIndex)
      pool[n.prev].next = i;
    else
      front_ = i;
    pool[pos].prev = i;
    ++size_;
  }

  // Removes i (which is in this list).
  void Unlink(std::vector<Node>& pool, uint32_t i) {
    Node& n = pool[i];
    if (n.prev != kNilIndex)
      pool[n.prev].next = n.next;
    else
      front_ = n.next;
    if (n.next != kNilIndex)
      pool[n.next].prev = n.prev;
    else
      back_ = n.prev;
    n.prev = n.next = kNilIndex;
    CHECK(size_ > 0);
    --size_;
  }

  // Moves i (which is in this list) to the front.
  void MoveToFront(std::vector<Node>& pool, uint32_t i) {
    if (front_ == i) return;
    Unlink(pool, i);
    PushFront(pool, i);
  }

  // Forgets every node (their links are left as they were).
  void Clear() {
    front_ = back_ = kNilIndex;
    size_ = 0;
  }

 private:
  uint32_t front_ = kNilIndex;
  uint32_t back_ = kNilIndex;
  int64_t size_ = 0;
};

// A fixed pool of `n` nodes with a free list, for lists of keys that come and go (the policies).
template <typename Node>
class NodePool {
 public:
  explicit NodePool(int64_t n) : nodes_(n) {
    free_.reserve(n);
    for (int64_t i = n - 1; i >= 0; --i) free_.push_back(static_cast<uint32_t>(i));
  }
  // CHECKs that a node is free: callers bound what they hold by the pool's size.
  uint32_t Allocate() {
    CHECK_MSG(!free_.empty(), "node pool exhausted");
    const uint32_t i = free_.back();
    free_.pop_back();
    return i;
  }
  void Free(uint32_t i) { free_.push_back(i); }
  std::vector<Node>& nodes() { return nodes_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  Node& operator[](uint32_t i) { return nodes_[i]; }
  const Node& operator[](uint32_t i) const { return nodes_[i]; }

 private:
  std::vector<Node> nodes_;
  std::vector<uint32_t> free_;
};

}  // namespace mer
