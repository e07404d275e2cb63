#include "services/compute/cuda/quantize.cuh"

#include "services/compute/cuda/act_store.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/kquant_quantize.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kThreads = 128;
// Rows per block: their loads are issued together, so a prompt's many short rows (a 512-token
// step's 4,096 pairs of 768 columns) take a few waves of blocks rather than one block per row and
// 128 columns, each waiting for its one load (33.8 us a layer on the H100 at 512 tokens).
constexpr int kRowsPerBlock = 8;

// Q8_1: a warp per block of 32. The quants and d as StoreAct's Q8_0; the exact int sum of the
// unclamped quants by shuffles.
__device__ inline void StoreQ8_1(const DevAct& act, int64_t row, int64_t i, float v) {
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

// Columns kThreads * blockIdx.x.. of rows kRowsPerBlock * blockIdx.y.. (fewer in the last block).
template <bool kQ8_1>
__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(const float* x, int64_t x_stride, int n_rows, int64_t n, DevAct act) {
  AllowDependents();
  WaitForPredecessor();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  // Whole warps exit together (n is a multiple of 32), as the Q8_0 and Q8_1 stores need; the
  // row count is the block's.
  if (i >= n) return;
  const int64_t row0 = int64_t(blockIdx.y) * kRowsPerBlock;
  const int rows = static_cast<int>(min(int64_t{kRowsPerBlock}, n_rows - row0));
  float v[kRowsPerBlock];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r)
    if (r < rows) v[r] = x[(row0 + r) * x_stride + i];
#pragma unroll
  for (int r = 0; r < kRowsPerBlock; ++r) {
    if (r >= rows) break;
    if constexpr (kQ8_1)
      StoreQ8_1(act, row0 + r, i, v[r]);
    else
      StoreAct(act, row0 + r, i, v[r]);
  }
}

}  // namespace

bool KernelsStoreAct(int act_type) { return StoreActWrites(act_type); }

void LaunchQuantize(const float* x, int64_t x_stride, int n_rows, int64_t n, const DevAct& act, cudaStream_t stream) {
  if (n_rows == 0) return;
  if (act.type == kDevQ8_K) return LaunchQuantizeQ8_K(x, x_stride, n_rows, n, act, stream);
  const dim3 grid((n + kThreads - 1) / kThreads, (n_rows + kRowsPerBlock - 1) / kRowsPerBlock);
  if (act.type == kDevQ8_1) {
    LaunchPdl(QuantizeKernel<true>, grid, dim3(kThreads), 0, stream, x, x_stride, n_rows, n, act);
    return;
  }
  LaunchPdl(QuantizeKernel<false>, grid, dim3(kThreads), 0, stream, x, x_stride, n_rows, n, act);
}

}  // namespace mer::cuda
