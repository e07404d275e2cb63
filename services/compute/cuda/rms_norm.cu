#include "services/compute/cuda/rms_norm.cuh"

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/pdl.cuh"
#include "services/compute/cuda/rms_norm_row.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kMaxPerThread = 8;  // n <= kThreads * kMaxPerThread (CHECKed by the engine)
constexpr int kCombineInFlight = 8;

// One block per row; the row is read once into registers (decode is latency-bound here).
// kPerThread = ceil(n / kThreads), a template parameter so that every load of the row (x, the
// experts' outputs and weights) is issued before the first store: x's store could alias them, so
// a load after it would wait for the chain before it (one L2 round trip per element of a thread).
// The norm's weights depend on nothing and are loaded before the wait.
template <int kPerThread>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(float* x, int64_t x_stride, const int32_t* rows, MoeCombine combine, const float* w, float eps,
                  int64_t n, float* y, int64_t y_stride, DevAct act) {
  AllowDependents();
  // Up to 2,048 columns every load is issued ahead; beyond, the 64 registers of a 1,024-thread
  // block would spill, and the loads go one element at a time after the wait.
  constexpr bool kAhead = kPerThread <= 2;
  float wv[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (kAhead) wv[k] = i < n ? w[i] : 0.0f;
  }
  WaitForPredecessor();
  const int64_t row = blockIdx.x;
  const int64_t t = rows != nullptr ? rows[row] : row;
  float* xr = x + t * x_stride;
  const bool combining = combine.expert_out != nullptr;
  constexpr int kLoadAhead = kAhead ? kPerThread : 1;
  float xv[kPerThread];
  float cw[kCombineInFlight];
  const float* e = combining ? combine.expert_out + t * combine.k * n : nullptr;
#pragma unroll
  for (int j = 0; j < kCombineInFlight; ++j)
    cw[j] = kAhead && combining && j < combine.k ? combine.weights[t * combine.k + j] : 0.0f;
  double sum = 0.0;
#pragma unroll
  for (int k0 = 0; k0 < kPerThread; k0 += kLoadAhead) {
    float ev[kLoadAhead][kCombineInFlight];
#pragma unroll
    for (int u = 0; u < kLoadAhead; ++u) {
      const int64_t i = threadIdx.x + int64_t(k0 + u) * kThreads;
      xv[k0 + u] = i < n ? xr[i] : 0.0f;
#pragma unroll
      for (int j = 0; j < kCombineInFlight; ++j) ev[u][j] = combining && i < n && j < combine.k ? e[j * n + i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoadAhead; ++u) {
      const int k = k0 + u;
      const int64_t i = threadIdx.x + int64_t(k) * kThreads;
      if (combining && i < n) {
        // The previous layer's MoE output into the residual stream, as the CPU engine's
        // `acc + ej * wj` chain (GCC contracts it to fma(ej, wj, acc)), then acc + x.
        const float* wj = combine.weights + t * combine.k;
        float acc = __fmul_rn(ev[u][0], kAhead ? cw[0] : wj[0]);
#pragma unroll
        for (int j = 1; j < kCombineInFlight; ++j)
          if (j < combine.k) acc = fmaf(ev[u][j], kAhead ? cw[j] : wj[j], acc);
        for (int j = kCombineInFlight; j < combine.k; ++j)
          acc = fmaf(e[j * n + i], combine.weights[t * combine.k + j], acc);
        xv[k] = __fadd_rn(acc, xv[k]);
        xr[i] = xv[k];
      }
      sum += static_cast<double>(xv[k] * xv[k]);
    }
  }
  const float scale = BlockRmsScale<kThreads>(sum, n, eps);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i >= n) break;  // whole warps (n is a multiple of 32)
    const float v = __fmul_rn(__fmul_rn(xv[k], scale), kAhead ? wv[k] : w[i]);
    if (y != nullptr) y[row * y_stride + i] = v;
    if (act.data != nullptr) StoreAct(act, row, i, v);
  }
}

}  // namespace

void LaunchRmsNorm(float* x, int64_t x_stride, const int32_t* rows, int n_rows, const MoeCombine& combine,
                   const float* w, float eps, int64_t n, float* y, int64_t y_stride, const DevAct& act,
                   cudaStream_t stream) {
  if (n_rows == 0) return;
  const int64_t per_thread = (n + kThreads - 1) / kThreads;
  auto* kernel = per_thread <= 1   ? RmsNormKernel<1>
                 : per_thread <= 2 ? RmsNormKernel<2>
                 : per_thread <= 4 ? RmsNormKernel<4>
                                   : RmsNormKernel<kMaxPerThread>;
  LaunchPdl(kernel, dim3(n_rows), dim3(kThreads), 0, stream, x, x_stride, rows, combine, w, eps, n, y, y_stride, act);
}

}  // namespace mer::cuda
