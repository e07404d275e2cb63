#include "services/compute/cuda/quantize.cuh"

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/kquant_quantize.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) QuantizeKernel(const float* x, int64_t x_stride, int64_t n, DevAct act) {
  AllowDependents();
  WaitForPredecessor();
  const int64_t row = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  // Whole warps exit together (n is a multiple of 32), as StoreAct's Q8_0 path needs.
  if (i >= n) return;
  StoreAct(act, row, i, x[row * x_stride + i]);
}

}  // namespace

void LaunchQuantize(const float* x, int64_t x_stride, int n_rows, int64_t n, const DevAct& act, cudaStream_t stream) {
  if (n_rows == 0) return;
  if (act.type == kDevQ8_K) return LaunchQuantizeQ8_K(x, x_stride, n_rows, n, act, stream);
  LaunchPdl(QuantizeKernel, dim3((n + kThreads - 1) / kThreads, n_rows), dim3(kThreads), 0, stream, x, x_stride, n,
            act);
}

}  // namespace mer::cuda
