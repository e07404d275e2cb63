#include "services/compute/cuda/kquant_quantize.cuh"

#include <climits>
#include <cstdio>
#include <cstdlib>

#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/kquant_layout.cuh"
#include "services/compute/cuda/pdl.cuh"

namespace mer::cuda {
namespace {

constexpr int kWarps = 4;  // one 256-block per warp

// Lane l holds elements 8l .. 8l + 7 of the block: bsums[j] is lanes 2j and 2j + 1.
__global__ void __launch_bounds__(kWarps * 32)
    QuantizeQ8_KKernel(const float* x, int64_t x_stride, int64_t n, int64_t n_blocks_total, DevAct act) {
  AllowDependents();
  WaitForPredecessor();
  const int lane = threadIdx.x % 32;
  const int64_t q = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;  // block over all rows
  if (q >= n_blocks_total) return;                                    // whole warps
  const int64_t nb = n / kKBlock, row = q / nb, b = q % nb;
  const float* xb = x + row * x_stride + b * kKBlock + 8 * lane;
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = xb[k];
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(v[k]));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  uint8_t* out = act.data + row * Q8_KRowBytes(act.stride);
  int16_t* bsums = reinterpret_cast<int16_t*>(out + Q8_KBsumsOffset(act.stride, b));
  float* d = act.scales + row * (act.stride / kKBlock) + b;
  // Word offsets of the lane's elements 8l .. 8l + 3 and 8l + 4 .. 8l + 7 (4 bytes each).
  uint32_t* w0 = reinterpret_cast<uint32_t*>(out + Q8_KQuantOffset(b * kKBlock + 8 * lane));
  uint32_t* w1 = reinterpret_cast<uint32_t*>(out + Q8_KQuantOffset(b * kKBlock + 8 * lane + 4));
  if (amax == 0.0f) {
    *w0 = 0;
    *w1 = 0;
    if (lane % 2 == 0) bsums[lane / 2] = 0;
    if (lane == 0) *d = 0.0f;
    return;
  }
  // The first element of largest magnitude (ties: the lowest index, as the CPU's search).
  int first = INT_MAX;
  float first_v = 0.0f;
#pragma unroll
  for (int k = 7; k >= 0; --k)
    if (fabsf(v[k]) == amax) {
      first = 8 * lane + k;
      first_v = v[k];
    }
  int index = first;
  for (int o = 16; o > 0; o >>= 1) index = min(index, __shfl_xor_sync(0xffffffffu, index, o));
  const float max = __shfl_sync(0xffffffffu, first_v, index / 8);
  const float iscale = __fdiv_rn(-127.0f, max);
  int sum = 0;
  uint32_t packed[2] = {0, 0};
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const int qv = min(127, __float2int_rn(__fmul_rn(iscale, v[k])));
    sum += qv;
    packed[k / 4] |= (static_cast<uint32_t>(qv) & 0xffu) << (8 * (k % 4));
  }
  *w0 = packed[0];
  *w1 = packed[1];
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  if (lane % 2 == 0) bsums[lane / 2] = static_cast<int16_t>(sum);
  if (lane == 0) *d = __fdiv_rn(1.0f, iscale);
}

}  // namespace

void LaunchQuantizeQ8_K(const float* x, int64_t x_stride, int n_rows, int64_t n, const DevAct& act,
                        cudaStream_t stream) {
  if (n % kKBlock != 0 || act.stride % kKBlock != 0 || act.type != kDevQ8_K) {
    std::fprintf(stderr, "quantize q8_k: n %lld, stride %lld, type %d\n", static_cast<long long>(n),
                 static_cast<long long>(act.stride), act.type);
    std::abort();
  }
  const int64_t total = int64_t(n_rows) * (n / kKBlock);
  if (total == 0) return;
  LaunchPdl(QuantizeQ8_KKernel, dim3(static_cast<unsigned>((total + kWarps - 1) / kWarps)), dim3(kWarps * 32), 0,
            stream, x, x_stride, n, total, act);
}

}  // namespace mer::cuda
