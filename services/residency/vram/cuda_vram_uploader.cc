// CreateCudaVramUploader with CUDA: cudaIpcOpenMemHandle, cudaHostRegister, cudaMemcpyAsync.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "services/residency/vram/vram_uploader.h"

namespace mer::residency {
namespace {

absl::Status CudaError(const char* what, cudaError_t e) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

class CudaVramUploader final : public VramUploader {
 public:
  CudaVramUploader(void* pool, uint64_t pool_bytes, int max_inflight)
      : pool_(pool), pool_bytes_(pool_bytes), max_inflight_(max_inflight) {}
  ~CudaVramUploader() override {
    Close();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (registered_) cudaHostUnregister(pool_);
  }

  absl::Status Import(const shm::VramArenaInfo& info) override {
    Close();
    int device = -1;
    if (cudaError_t e = cudaDeviceGetByPCIBusId(&device, info.pci_bus_id.c_str()); e != cudaSuccess)
      return CudaError(absl::StrCat("cudaDeviceGetByPCIBusId(", info.pci_bus_id, ")").c_str(), e);
    if (stream_ != nullptr && device != device_)
      return absl::FailedPreconditionError(
          absl::StrCat("the arena is on device ", info.pci_bus_id, ", an earlier one was on another device"));
    if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return CudaError("cudaSetDevice", e);
    device_ = device;
    if (stream_ == nullptr) {
      if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
        return CudaError("cudaStreamCreateWithFlags", e);
      events_.resize(max_inflight_);
      for (cudaEvent_t& ev : events_)
        if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess)
          return CudaError("cudaEventCreateWithFlags", e);
      for (int i = 0; i < max_inflight_; ++i) free_events_.push_back(i);
    }
    if (!registered_ && pool_bytes_ > 0) {
      // The RAM tier may be registered by HostPinning (--pin auto) already: then it is pinned in
      // this process for every context (cudaHostRegisterPortable), which is what the copies need.
      const cudaError_t e = cudaHostRegister(pool_, pool_bytes_, cudaHostRegisterPortable);
      if (e == cudaSuccess) {
        registered_ = true;
        pinning_ = "RAM tier registered (cudaHostRegister)";
      } else if (e == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        pinning_ = "RAM tier already registered";
      } else {
        (void)cudaGetLastError();
        pinning_ = absl::StrCat("RAM tier pageable (cudaHostRegister: ", cudaGetErrorString(e), ")");
      }
    }
    cudaIpcMemHandle_t handle;
    static_assert(sizeof(handle) == shm::kIpcHandleBytes);
    std::memcpy(&handle, info.ipc_handle.data(), sizeof(handle));
    void* base = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess)
      return CudaError("cudaIpcOpenMemHandle", e);
    arena_ = static_cast<uint8_t*>(base);
    slot_bytes_ = info.slot_bytes;
    slot_count_ = info.slot_count;
    bus_id_ = info.pci_bus_id;
    return absl::OkStatus();
  }

  void Close() override {
    if (arena_ == nullptr) return;
    // Copies into the arena must end before its mapping goes (their tags are dropped).
    cudaStreamSynchronize(stream_);
    inflight_.clear();
    free_events_.clear();
    for (int i = 0; i < max_inflight_; ++i) free_events_.push_back(i);
    cudaIpcCloseMemHandle(arena_);
    (void)cudaGetLastError();
    arena_ = nullptr;
  }

  absl::Status Start(uint32_t slot, const void* src, uint64_t bytes, uint64_t tag) override {
    return Copy(slot, const_cast<void*>(src), bytes, tag, cudaMemcpyHostToDevice);
  }
  absl::Status StartDownload(uint32_t slot, void* dst, uint64_t bytes, uint64_t tag) override {
    return Copy(slot, dst, bytes, tag, cudaMemcpyDeviceToHost);
  }

  absl::Status Poll(std::vector<uint64_t>* done) override {
    // One stream: copies complete in order, so the oldest event gates the rest.
    while (!inflight_.empty()) {
      const cudaError_t e = cudaEventQuery(events_[inflight_.front().event]);
      if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        break;
      }
      if (e != cudaSuccess) return CudaError("a copy into or out of the VRAM arena failed", e);
      done->push_back(inflight_.front().tag);
      free_events_.push_back(inflight_.front().event);
      inflight_.pop_front();
    }
    return absl::OkStatus();
  }

  int inflight() const override { return static_cast<int>(inflight_.size()); }
  int max_inflight() const override { return max_inflight_; }
  std::string Describe() const override {
    return absl::StrCat("CUDA IPC arena on ", bus_id_, ": ", slot_count_, " slots x ", slot_bytes_, " bytes; ",
                        pinning_);
  }

 private:
  struct InFlight {
    int event;
    uint64_t tag;
  };

  // One copy between arena slot `slot` and host memory `host` on the stream (host to device: an
  // upload; device to host: a demotion), followed by an event.
  absl::Status Copy(uint32_t slot, void* host, uint64_t bytes, uint64_t tag, cudaMemcpyKind kind) {
    if (arena_ == nullptr) return absl::FailedPreconditionError("no VRAM arena is open");
    if (slot >= slot_count_ || bytes > slot_bytes_)
      return absl::InvalidArgumentError(absl::StrCat("copy of ", bytes, " bytes with slot ", slot, " of an arena of ",
                                                     slot_count_, " x ", slot_bytes_, " bytes"));
    if (free_events_.empty()) return absl::ResourceExhaustedError("every copy event is in flight");
    const int ev = free_events_.front();
    uint8_t* arena_slot = arena_ + uint64_t{slot} * slot_bytes_;
    const bool up = kind == cudaMemcpyHostToDevice;
    if (cudaError_t e =
            cudaMemcpyAsync(up ? static_cast<void*>(arena_slot) : host, up ? host : arena_slot, bytes, kind, stream_);
        e != cudaSuccess)
      return CudaError(up ? "cudaMemcpyAsync into the VRAM arena" : "cudaMemcpyAsync out of the VRAM arena", e);
    if (cudaError_t e = cudaEventRecord(events_[ev], stream_); e != cudaSuccess) return CudaError("cudaEventRecord", e);
    free_events_.pop_front();
    inflight_.push_back({ev, tag});
    return absl::OkStatus();
  }

  void* const pool_;
  const uint64_t pool_bytes_;
  const int max_inflight_;
  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::deque<int> free_events_;
  std::deque<InFlight> inflight_;
  bool registered_ = false;
  std::string pinning_ = "RAM tier not registered";
  uint8_t* arena_ = nullptr;
  uint64_t slot_bytes_ = 0;
  uint32_t slot_count_ = 0;
  std::string bus_id_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<VramUploader>> CreateCudaVramUploader(void* ram_pool, uint64_t ram_pool_bytes,
                                                                     int max_inflight) {
  if (max_inflight < 1) return absl::InvalidArgumentError("max_inflight must be >= 1");
  int n = 0;
  if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n == 0) {
    if (e != cudaSuccess) return CudaError("no CUDA device for VRAM uploads (cudaGetDeviceCount)", e);
    return absl::FailedPreconditionError("no CUDA device for VRAM uploads");
  }
  return std::unique_ptr<VramUploader>(new CudaVramUploader(ram_pool, ram_pool_bytes, max_inflight));
}

}  // namespace mer::residency
