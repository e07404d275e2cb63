#include "services/compute/cuda/stream_memops.h"

#include <cuda.h>
#include <cuda_runtime.h>

namespace mer::cuda {
namespace {

using WaitFn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteFn = CUresult(CUDAAPI*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct Entries {
  WaitFn wait = nullptr;
  WriteFn write = nullptr;
};

const Entries& Lookup() {
  static const Entries e = [] {
    Entries r;
    void* wait = nullptr;
    void* write = nullptr;
    cudaDriverEntryPointQueryResult q1 = cudaDriverEntryPointSymbolNotFound, q2 = q1;
    // The 11.7 ABI of both (the v2 stream memory operations, enabled on every platform).
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &wait, 11070, cudaEnableDefault, &q1) == cudaSuccess &&
        q1 == cudaDriverEntryPointSuccess &&
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &write, 11070, cudaEnableDefault, &q2) ==
            cudaSuccess &&
        q2 == cudaDriverEntryPointSuccess) {
      r.wait = reinterpret_cast<WaitFn>(wait);
      r.write = reinterpret_cast<WriteFn>(write);
    } else {
      (void)cudaGetLastError();
    }
    return r;
  }();
  return e;
}

}  // namespace

bool KernelsLoadLazily() {
  using LoadingModeFn = CUresult(CUDAAPI*)(CUmoduleLoadingMode*);
  static const bool lazy = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 11070, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return true;  // cannot tell: assume the driver's default (lazy since CUDA 12.2)
    }
    CUmoduleLoadingMode mode = CU_MODULE_LAZY_LOADING;
    return reinterpret_cast<LoadingModeFn>(fn)(&mode) != CUDA_SUCCESS || mode != CU_MODULE_EAGER_LOADING;
  }();
  return lazy;
}

bool StreamMemOpsAvailable() { return Lookup().wait != nullptr && Lookup().write != nullptr; }

bool StreamWaitEqual(CUstream_st* stream, uint32_t* word, uint32_t value) {
  const Entries& e = Lookup();
  return e.wait != nullptr &&
         e.wait(stream, reinterpret_cast<CUdeviceptr>(word), value, CU_STREAM_WAIT_VALUE_EQ) == CUDA_SUCCESS;
}

bool StreamWrite(CUstream_st* stream, uint32_t* word, uint32_t value) {
  const Entries& e = Lookup();
  return e.write != nullptr &&
         e.write(stream, reinterpret_cast<CUdeviceptr>(word), value, CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS;
}

}  // namespace mer::cuda
