#include "services/compute/cuda/nccl_exchange.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/nccl_api.h"

namespace mer {

class NcclExchangeGroup::Rank final : public DeviceExpertExchange {
 public:
  Rank(NcclExchangeGroup& group, int rank) : group_(group), rank_(rank) {}
  absl::Status EnqueueSum(float* device_values, size_t count, CUstream_st* stream) override {
    return group_.EnqueueSum(rank_, device_values, count, stream);
  }
  void Fail(const absl::Status& why) override { group_.Fail(why); }
  absl::Status status() const override { return group_.status(); }
  uint64_t generation() const override { return group_.generation_.load(std::memory_order_acquire); }

 private:
  NcclExchangeGroup& group_;
  const int rank_;
};

absl::StatusOr<std::unique_ptr<NcclExchangeGroup>> NcclExchangeGroup::Create(std::vector<int> devices) {
  int n_devices = 0;
  if (cudaGetDeviceCount(&n_devices) != cudaSuccess) {
    (void)cudaGetLastError();
    n_devices = 0;
  }
  if (devices.empty()) return absl::InvalidArgumentError("NCCL exchange: no devices");
  for (size_t i = 0; i < devices.size(); ++i) {
    if (devices[i] < 0 || devices[i] >= n_devices)
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL exchange: GPU ", devices[i], " of the ", n_devices, " this process sees"));
    if (std::find(devices.begin(), devices.begin() + i, devices[i]) != devices.begin() + i)
      return absl::InvalidArgumentError(absl::StrCat("NCCL exchange: GPU ", devices[i],
                                                     " given twice (NCCL takes one rank per device; ranks that "
                                                     "share a GPU exchange on the host)"));
  }
  // Every link NCCL may use is connected when the communicators are made, not at a first
  // collective of each kind: its buffers are then taken before the engines size their arenas from
  // the free VRAM. An operator's own setting stands.
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  ASSIGN_OR_RETURN(const cuda::NcclApi* nccl, cuda::LoadNccl());
  std::unique_ptr<NcclExchangeGroup> group(new NcclExchangeGroup(nccl, std::move(devices)));
  RETURN_IF_ERROR(group->MakeCommunicators());
  return group;
}

NcclExchangeGroup::NcclExchangeGroup(const cuda::NcclApi* nccl, std::vector<int> devices)
    : nccl_(nccl), devices_(std::move(devices)) {
  for (int r = 0; r < n_ranks(); ++r) {
    ranks_.push_back(std::make_unique<Rank>(*this, r));
    comms_.push_back(std::make_unique<Comm>());
  }
}

NcclExchangeGroup::~NcclExchangeGroup() {
  // The ranks' engines, which synchronise their streams when they go, are gone before the group.
  for (const std::unique_ptr<Comm>& c : comms_) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->comm != nullptr) (void)nccl_->CommDestroy(c->comm);
  }
}

DeviceExpertExchange& NcclExchangeGroup::rank(int r) { return *ranks_[r]; }

absl::Status NcclExchangeGroup::MakeCommunicators() {
  const int n = n_ranks();
  std::vector<ncclComm_t> made(n, nullptr);
  const ncclResult_t init = nccl_->CommInitAll(made.data(), n, devices_.data());
  if (init != ncclSuccess)
    return absl::UnavailableError(absl::StrCat("ncclCommInitAll over GPUs ", absl::StrJoin(devices_, ","), ": ",
                                               nccl_->GetErrorString(init), " (", nccl_->GetLastError(nullptr), ")"));
  // One sum of each rank's 1.0, issued from this thread (hence the NCCL group call): n on every
  // device, or the group does not work on these devices.
  int previous = 0;
  CUDA_CHECK(cudaGetDevice(&previous));
  std::vector<float*> one(n, nullptr);
  std::vector<cudaStream_t> streams(n, nullptr);
  const float value = 1.0f;
  for (int r = 0; r < n; ++r) {
    CUDA_CHECK(cudaSetDevice(devices_[r]));
    CUDA_CHECK(cudaMalloc(&one[r], sizeof(float)));
    CUDA_CHECK(cudaMemcpy(one[r], &value, sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
  }
  ncclResult_t sum = nccl_->GroupStart();
  for (int r = 0; r < n && sum == ncclSuccess; ++r)
    sum = nccl_->AllReduce(one[r], one[r], 1, ncclFloat, ncclSum, made[r], streams[r]);
  const ncclResult_t end = nccl_->GroupEnd();
  if (sum == ncclSuccess) sum = end;
  absl::Status status;
  for (int r = 0; r < n; ++r) {
    CUDA_CHECK(cudaSetDevice(devices_[r]));
    float got = 0;
    if (sum == ncclSuccess) {
      CUDA_CHECK(cudaStreamSynchronize(streams[r]));
      CUDA_CHECK(cudaMemcpy(&got, one[r], sizeof(float), cudaMemcpyDeviceToHost));
      if (got != static_cast<float>(n) && status.ok())
        status = absl::InternalError(
            absl::StrCat("NCCL exchange: the check's sum on GPU ", devices_[r], " is ", got, ", not ", n));
    }
    CUDA_CHECK(cudaStreamDestroy(streams[r]));
    CUDA_CHECK(cudaFree(one[r]));
  }
  CUDA_CHECK(cudaSetDevice(previous));
  if (sum != ncclSuccess)
    status =
        absl::UnavailableError(absl::StrCat("NCCL exchange: the check's ncclAllReduce: ", nccl_->GetErrorString(sum),
                                            " (", nccl_->GetLastError(made[0]), ")"));
  if (!status.ok()) {
    for (ncclComm_t c : made) (void)nccl_->CommAbort(c);
    return status;
  }
  for (int r = 0; r < n; ++r) {
    std::lock_guard<std::mutex> lock(comms_[r]->mu);
    comms_[r]->comm = made[r];
  }
  return absl::OkStatus();
}

absl::Status NcclExchangeGroup::EnqueueSum(int rank, float* values, size_t count, CUstream_st* stream) {
  if (failed_flag_.load(std::memory_order_acquire)) return status();
  Comm& c = *comms_[rank];
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.comm == nullptr) return status();  // aborted by a Fail that has set failed_ first
  // NCCL's enqueue does not wait for the other ranks (each rank calls from a thread of its own):
  // the all-reduce runs on the device once every rank's is there.
  const ncclResult_t r = nccl_->AllReduce(values, values, count, ncclFloat, ncclSum, c.comm, stream);
  if (r != ncclSuccess)
    return absl::UnavailableError(absl::StrCat("ncclAllReduce of rank ", rank, " (GPU ", devices_[rank], "): ",
                                               nccl_->GetErrorString(r), " (", nccl_->GetLastError(c.comm), ")"));
  return absl::OkStatus();
}

void NcclExchangeGroup::Fail(const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.ok()) failed_ = why.ok() ? absl::InternalError("expert exchange failed") : why;
    failed_flag_.store(true, std::memory_order_release);
  }
  for (const std::unique_ptr<Comm>& c : comms_) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->comm != nullptr) (void)nccl_->CommAbort(c->comm);
    c->comm = nullptr;
  }
}

absl::Status NcclExchangeGroup::status() const {
  if (!failed_flag_.load(std::memory_order_acquire)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

void NcclExchangeGroup::Reset() {
  if (!failed_flag_.load(std::memory_order_acquire)) return;
  // Fail aborted every communicator; the ranks are out of their steps.
  if (const absl::Status made = MakeCommunicators(); !made.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = absl::Status(made.code(), absl::StrCat("the expert exchange could not be made anew: ", made.message()));
    return;
  }
  generation_.fetch_add(1, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  failed_ = absl::OkStatus();
  failed_flag_.store(false, std::memory_order_release);
}

}  // namespace mer
