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

// Q8_1: a warp per block of 32 (n is a multiple of 32, so whole warps exit together). The quants
// and d as StoreAct's Q8_0; the exact int sum of the unclamped quants by shuffles.
__global__ void __launch_bounds__(kThreads)
    QuantizeQ8_1Kernel(const float* x, int64_t x_stride, int64_t n, DevAct act) {
  AllowDependents();
  WaitForPredecessor();
  const int64_t row = blockIdx.y;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  const float v = x[row * x_stride + i];
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const int q = __float2int_rn(__fmul_rn(v, id));
  act.data[row * act.stride + Q8_0QuantOffset(i, act.stride / 32)] = static_cast<uint8_t>(max(-128, min(127, q)));
  int sum = q;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((i & 31) == 0) {
    const uint32_t dh = __half_as_ushort(__float2half_rn(d));
    const uint32_t sh = __half_as_ushort(__float2half_rn(__fmul_rn(d, static_cast<float>(sum))));
    reinterpret_cast<uint32_t*>(act.scales)[row * (act.stride / 32) + i / 32] = dh | (sh << 16);
  }
}

}  // namespace

bool KernelsStoreAct(int act_type) { return StoreActWrites(act_type); }

void LaunchQuantize(const float* x, int64_t x_stride, int n_rows, int64_t n, const DevAct& act, cudaStream_t stream) {
  if (n_rows == 0) return;
  if (act.type == kDevQ8_K) return LaunchQuantizeQ8_K(x, x_stride, n_rows, n, act, stream);
  if (act.type == kDevQ8_1) {
    LaunchPdl(QuantizeQ8_1Kernel, dim3((n + kThreads - 1) / kThreads, n_rows), dim3(kThreads), 0, stream, x, x_stride,
              n, act);
    return;
  }
  LaunchPdl(QuantizeKernel, dim3((n + kThreads - 1) / kThreads, n_rows), dim3(kThreads), 0, stream, x, x_stride, n,
            act);
}

}  // namespace mer::cuda
