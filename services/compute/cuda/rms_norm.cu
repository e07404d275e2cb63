#include "services/compute/cuda/rms_norm.cuh"

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/rms_norm_row.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kPerThread = 8;  // n <= kThreads * kPerThread (CHECKed by the engine)
constexpr int kCombineInFlight = 8;

// One block per row; the row is read once into registers (decode is latency-bound here).
__global__ void __launch_bounds__(kThreads) RmsNormKernel(float* x, int64_t x_stride, const int32_t* rows,
                                                          MoeCombine combine, const float* w, float eps,
                                                          int64_t n, float* y, int64_t y_stride, DevAct act) {
  AllowDependents();
  WaitForPredecessor();
  const int64_t row = blockIdx.x;
  const int64_t t = rows != nullptr ? rows[row] : row;
  float* xr = x + t * x_stride;
  float xv[kPerThread];
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kThreads;
    xv[k] = i < n ? xr[i] : 0.0f;
    if (combine.expert_out != nullptr && i < n) {
      // The previous layer's MoE output into the residual stream, as the CPU engine's
      // `acc + ej * wj` chain (GCC contracts it to fma(ej, wj, acc)), then acc + x.
      const float* e = combine.expert_out + t * combine.k * n + i;
      const float* cw = combine.weights + t * combine.k;
      // Up to kCombineInFlight outputs loaded before the chain uses them (a load inside the
      // chain would wait for the previous fma: one L2 round trip per expert).
      float ev[kCombineInFlight], wv[kCombineInFlight];
#pragma unroll
      for (int j = 0; j < kCombineInFlight; ++j) {
        ev[j] = j < combine.k ? e[j * n] : 0.0f;
        wv[j] = j < combine.k ? cw[j] : 0.0f;
      }
      float acc = __fmul_rn(ev[0], wv[0]);
#pragma unroll
      for (int j = 1; j < kCombineInFlight; ++j)
        if (j < combine.k) acc = fmaf(ev[j], wv[j], acc);
      for (int j = kCombineInFlight; j < combine.k; ++j) acc = fmaf(e[j * n], cw[j], acc);
      xv[k] = __fadd_rn(acc, xv[k]);
      xr[i] = xv[k];
    }
    sum += static_cast<double>(xv[k] * xv[k]);
  }
  const float scale = BlockRmsScale<kThreads>(sum, n, eps);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i >= n) break;  // whole warps (n is a multiple of 32)
    const float v = __fmul_rn(__fmul_rn(xv[k], scale), w[i]);
    if (y != nullptr) y[row * y_stride + i] = v;
    if (act.data != nullptr) StoreAct(act, row, i, v);
  }
}

}  // namespace

void LaunchRmsNorm(float* x, int64_t x_stride, const int32_t* rows, int n_rows, const MoeCombine& combine,
                   const float* w, float eps, int64_t n, float* y, int64_t y_stride, const DevAct& act,
                   cudaStream_t stream) {
  if (n_rows == 0) return;
  LaunchPdl(RmsNormKernel, dim3(n_rows), dim3(kThreads), 0, stream, x, x_stride, rows, combine, w, eps, n, y,
            y_stride, act);
}

}  // namespace mer::cuda
