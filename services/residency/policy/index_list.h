// Internal to the policies: doubly-linked lists threaded through a pool of nodes by index, so that
// moving a key to the front or unlinking it is O(1) and allocates nothing. A node type has
// `uint32_t prev, next` members; kNil ends a list. Front = most recently inserted.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/check.h"

namespace mer::residency::internal {

inline constexpr uint32_t kNil = 0xFFFFFFFFu;

template <typename Node>
class IndexList {
 public:
  uint32_t front() const { return front_; }
  uint32_t back() const { return back_; }
  int64_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  void PushFront(std::vector<Node>& pool, uint32_t i) {
    Node& n = pool[i];
    n.prev = kNil;
    n.next = front_;
    if (front_ != kNil) pool[front_].prev = i;
    front_ = i;
    if (back_ == kNil) back_ = i;
    ++size_;
  }

  void PushBack(std::vector<Node>& pool, uint32_t i) {
    Node& n = pool[i];
    n.next = kNil;
    n.prev = back_;
    if (back_ != kNil) pool[back_].next = i;
    back_ = i;
    if (front_ == kNil) front_ = i;
    ++size_;
  }

  // Inserts i just after `pos` (which is in this list).
  void InsertAfter(std::vector<Node>& pool, uint32_t pos, uint32_t i) {
    Node& n = pool[i];
    n.prev = pos;
    n.next = pool[pos].next;
    if (n.next != kNil) pool[n.next].prev = i; else back_ = i;
    pool[pos].next = i;
    ++size_;
  }

  // Inserts i just before `pos` (which is in this list).
  void InsertBefore(std::vector<Node>& pool, uint32_t pos, uint32_t i) {
    Node& n = pool[i];
    n.next = pos;
    n.prev = pool[pos].prev;
    if (n.prev != kNil) pool[n.prev].next = i; else front_ = i;
    pool[pos].prev = i;
    ++size_;
  }

  void Unlink(std::vector<Node>& pool, uint32_t i) {
    Node& n = pool[i];
    if (n.prev != kNil) pool[n.prev].next = n.next; else front_ = n.next;
    if (n.next != kNil) pool[n.next].prev = n.prev; else back_ = n.prev;
    n.prev = n.next = kNil;
    CHECK(size_ > 0);
    --size_;
  }

  void MoveToFront(std::vector<Node>& pool, uint32_t i) {
    if (front_ == i) return;
    Unlink(pool, i);
    PushFront(pool, i);
  }

  void Clear() { front_ = back_ = kNil; size_ = 0; }

 private:
  uint32_t front_ = kNil;
  uint32_t back_ = kNil;
  int64_t size_ = 0;
};

// A fixed pool of nodes with a free list.
template <typename Node>
class NodePool {
 public:
  explicit NodePool(int64_t n) : nodes_(n) {
    free_.reserve(n);
    for (int64_t i = n - 1; i >= 0; --i) free_.push_back(static_cast<uint32_t>(i));
  }
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

}  // namespace mer::residency::internal
