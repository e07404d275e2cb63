#include "services/compute/cpu/in_process_exchange.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mer {

class InProcessExchangeGroup::Rank final : public ExpertExchange {
 public:
  Rank(InProcessExchangeGroup& group, int rank) : group_(group), rank_(rank) {}
  absl::Status SumAcrossRanks(float* values, size_t count) override {
    return group_.SumAcrossRanks(rank_, values, count);
  }
  void Fail(const absl::Status& why) override { group_.Fail(why); }

 private:
  InProcessExchangeGroup& group_;
  const int rank_;
};

InProcessExchangeGroup::InProcessExchangeGroup(int n_ranks) : posted_(n_ranks) {
  for (int r = 0; r < n_ranks; ++r) ranks_.push_back(std::make_unique<Rank>(*this, r));
}

InProcessExchangeGroup::~InProcessExchangeGroup() = default;

ExpertExchange& InProcessExchangeGroup::rank(int r) { return *ranks_[r]; }

absl::Status InProcessExchangeGroup::SumAcrossRanks(int rank, float* values, size_t count) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !failed_.ok() || departing_ == 0; });
  if (!failed_.ok()) return failed_;
  if (arrived_ == 0) {
    count_ = count;
  } else if (count != count_) {
    failed_ = absl::InternalError(
        absl::StrCat("expert exchange: rank ", rank, " sent ", count, " values where the others sent ", count_));
    cv_.notify_all();
    return failed_;
  }
  posted_[rank] = values;
  if (++arrived_ == n_ranks()) {
    sum_.assign(posted_[0], posted_[0] + count);
    for (int r = 1; r < n_ranks(); ++r)
      for (size_t i = 0; i < count; ++i) sum_[i] += posted_[r][i];
    arrived_ = 0;
    departing_ = n_ranks();
    ++generation_;
    cv_.notify_all();
  } else {
    const uint64_t gathering = generation_;
    cv_.wait(lock, [&] { return !failed_.ok() || generation_ != gathering; });
    if (generation_ == gathering) return failed_;
  }
  std::copy(sum_.begin(), sum_.end(), values);
  if (--departing_ == 0) cv_.notify_all();
  return absl::OkStatus();
}

void InProcessExchangeGroup::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  failed_ = absl::OkStatus();
  std::fill(posted_.begin(), posted_.end(), nullptr);
  arrived_ = 0;
  departing_ = 0;
}

void InProcessExchangeGroup::Fail(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.ok()) failed_ = why.ok() ? absl::InternalError("expert exchange failed") : why;
  cv_.notify_all();
}

}  // namespace mer
