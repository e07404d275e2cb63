// CUDA_CHECK: CUDA calls whose failure is a programmer error or a sticky device fault abort at once
// with file and line, as CHECK does (common/base/check.h): such faults are not recoverable in the
// process, and systemd restarts the daemon.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CUDA_CHECK(expr)                                                                                             \
  do {                                                                                                               \
    const cudaError_t mer_cuda_err_ = (expr);                                                                        \
    if (mer_cuda_err_ != cudaSuccess) {                                                                              \
      std::fprintf(stderr, "%s:%d: CUDA error %s (%s) in %s\n", __FILE__, __LINE__, cudaGetErrorName(mer_cuda_err_), \
                   cudaGetErrorString(mer_cuda_err_), #expr);                                                        \
      std::fflush(stderr);                                                                                           \
      std::abort();                                                                                                  \
    }                                                                                                                \
  } while (0)

// After every kernel launch: a bad configuration shows here, a fault at the next synchronisation.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
