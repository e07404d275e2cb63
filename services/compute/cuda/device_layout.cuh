// How weights and activations lie in device memory, shared by every kernel of the cuda backend.
//
// Weights: F32, F16 and BF16 matrices as in the GGUF file (row-major). Q8_0 matrices are split
// (repack.cuh converts them on upload): all int8 quants first, [rows, cols], then the f16 block
// scales [rows, cols / 32]; the same bytes as the file's 34-byte blocks. Within a row, each run
// of 4 blocks (128 quants) is interleaved so that the 16 bytes lane l of an 8-lane group needs
// (quants 4l..4l+3 of each of the 4 blocks, the CPU kernel's int32 lane l) are contiguous: one
// 16-byte load per lane per 4 blocks (Q8_0QuantOffset; blocks past the last run of 4 stay plain).
//
// Activations (the input of a matrix product) are converted, like the CPU engine's, to the
// weight's dot type (ActivationTypeFor): f32, f16, bf16, or Q8_0 laid out the same way with f32
// scales holding the f16-rounded block scale.
//
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S and IQ1_S weights and their Q8_K
// activations, Q4_0, Q5_0 and IQ4_NL weights (with the Q8_0 activations above), and Q4_1 and Q5_1
// weights with their Q8_1 activations (Q8_0's layout, d and s as two f16 in each scales entry;
// written only by LaunchQuantize, rows of `stride` bytes, a type ActRowBytes does not take):
// kquant_layout.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mer::cuda {

// GgmlType values (common/tensor/ggml_type.h), repeated here so device code needs no host header.
enum DevType : int {
  kDevF32 = 0,
  kDevF16 = 1,
  kDevQ4_0 = 2,
  kDevQ4_1 = 3,
  kDevQ5_0 = 6,
  kDevQ5_1 = 7,
  kDevQ8_0 = 8,
  kDevQ8_1 = 9,
  kDevQ2_K = 10,
  kDevQ3_K = 11,
  kDevQ4_K = 12,
  kDevQ5_K = 13,
  kDevQ6_K = 14,
  kDevQ8_K = 15,
  kDevIQ2_XXS = 16,
  kDevIQ2_XS = 17,
  kDevIQ3_XXS = 18,
  kDevIQ1_S = 19,
  kDevIQ4_NL = 20,
  kDevIQ3_S = 21,
  kDevIQ2_S = 22,
  kDevIQ4_XS = 23,
  kDevBF16 = 30
};

struct DevMatrix {
  int type = kDevF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;  // device layout above
};

// Rows of activations: row t at data + t * row_bytes; Q8_0 scales of row t at scales + t * (stride / 32);
// Q8_K (kquant_layout.cuh): quants then bsums in the row, d of row t at scales + t * (stride / 256).
struct DevAct {
  int type = kDevF32;
  int64_t stride = 0;  // elements per row (>= cols)
  uint8_t* data = nullptr;
  float* scales = nullptr;  // Q8_0 and Q8_K only
};

__host__ __device__ inline int64_t ActRowBytes(int type, int64_t stride) {
  if (type == kDevQ8_K) return stride + stride / 8;  // quants, then int16 bsums per 16 (Q8_KRowBytes)
  return type == kDevF32 ? stride * 4 : (type == kDevQ8_0 ? stride : stride * 2);
}

// Byte offset of quant i in a Q8_0 row of n_blocks blocks (see above).
__host__ __device__ inline int64_t Q8_0QuantOffset(int64_t i, int64_t n_blocks) {
  const int64_t b = i / 32, within = i % 32;
  if (b >= n_blocks / 4 * 4) return i;
  return (b / 4) * 128 + (within / 4) * 16 + (b % 4) * 4 + within % 4;
}

// Word j (0..3) of a 16-byte load.
__host__ __device__ inline uint32_t Word(const uint4& v, int j) {
  return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
}

}  // namespace mer::cuda
