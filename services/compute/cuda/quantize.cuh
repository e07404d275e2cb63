// act[i, :] = f32 rows x[i, :] converted to the activation type (device_layout.cuh), n_rows rows
// of n elements; n a multiple of 32 (256 for Q8_K, kquant_quantize.cuh). Q8_1 (the activations of
// Q4_1 and Q5_1, kquant_layout.cuh) as the CPU's QuantizeRowQ8_1 (common/quant/q8_0.cc): Q8_0's
// quants and f16 d, and s = f16(d * sum(q)) from the f32 d.
#pragma once

#include <cuda_runtime.h>

#include "services/compute/cuda/device_layout.cuh"

namespace mer::cuda {

void LaunchQuantize(const float* x, int64_t x_stride, int n_rows, int64_t n, const DevAct& act, cudaStream_t stream);

// Whether kernels that produce rows (the norms, attention, the fused router) can write activations
// of this type themselves; for the others (Q8_K, Q8_1) they write f32 rows and LaunchQuantize
// converts them.
bool KernelsStoreAct(int act_type);

}  // namespace mer::cuda
