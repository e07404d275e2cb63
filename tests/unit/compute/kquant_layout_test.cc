// The cuda backend's arithmetic for the quantized types other than Q8_0, run on the host (no GPU
// needed): the device layouts and per-lane integer sums of services/compute/cuda/kquant_layout.cuh,
// driven the way the kernels drive them (kquant_dot.cuh: 8 lanes per row, an fma chain per lane or
// per row over the blocks, the CPU's reduction trees; kquant_quantize.cu: the Q8_K conversion;
// kquant_dequant.cuh: embedding rows), against the CPU engine's kernels, for exact equality. A
// failure names the type, size, row and token. The GPU runs the same functions
// (tests/gpu/cuda_kernels_test.cc checks the kernels).
#include "services/compute/cuda/kquant_layout.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/quant/iq1.h"
#include "common/quant/iq2.h"
#include "common/quant/iq3.h"
#include "common/quant/kernel_variant.h"
#include "common/quant/q4_k.h"
#include "common/quant/q6_k.h"
#include "common/quant/q8_0.h"
#include "common/quant/q8_k.h"
#include "common/quant/quant.h"
#include "services/compute/cuda/device_layout.cuh"
#include "services/compute/cuda/kquant_dequant.cuh"
#include "services/compute/cuda/mma_kquant.cuh"

namespace mer {
namespace {

using cuda::kKBlock;

std::mt19937 rng(20261215);

std::vector<float> Random(int64_t n, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// The weight types of 256-element blocks the cuda backend computes on with Q8_K activations.
constexpr GgmlType kTypes[] = {GgmlType::kQ2_K,  GgmlType::kQ3_K,    GgmlType::kQ4_K,    GgmlType::kQ5_K,
                               GgmlType::kQ6_K,  GgmlType::kIQ4_XS,  GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS,
                               GgmlType::kIQ2_S, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,   GgmlType::kIQ1_S};

int BlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K:
      return cuda::kQ2_KBlockBytes;
    case GgmlType::kQ3_K:
      return cuda::kQ3_KBlockBytes;
    case GgmlType::kQ4_K:
      return cuda::kQ4_KBlockBytes;
    case GgmlType::kQ5_K:
      return cuda::kQ5_KBlockBytes;
    case GgmlType::kQ6_K:
      return cuda::kQ6_KBlockBytes;
    case GgmlType::kIQ4_XS:
      return cuda::kIQ4_XSBlockBytes;
    case GgmlType::kIQ2_XXS:
      return cuda::kIQ2_XXSBlockBytes;
    case GgmlType::kIQ2_XS:
      return cuda::kIQ2_XSBlockBytes;
    case GgmlType::kIQ3_XXS:
      return cuda::kIQ3_XXSBlockBytes;
    case GgmlType::kIQ3_S:
      return cuda::kIQ3_SBlockBytes;
    case GgmlType::kIQ2_S:
      return cuda::kIQ2_SBlockBytes;
    case GgmlType::kIQ1_S:
      return cuda::kIQ1_SBlockBytes;
    case GgmlType::kQ4_0:
    case GgmlType::kIQ4_NL:
      return cuda::kTable4BlockBytes;
    case GgmlType::kQ5_0:
      return cuda::kQ5_0BlockBytes;
    case GgmlType::kQ4_1:
      return cuda::kQ4_1BlockBytes;
    case GgmlType::kQ5_1:
      return cuda::kQ5_1BlockBytes;
    default:
      ADD_FAILURE() << TypeName(type);
      return 1;
  }
}

// Weights of `rows` x `cols`: quantized from Gaussian floats, or (raw) random bytes with sane
// f16 scales, which reach every 6-bit scale/min pattern and int8 scale (-128 included), every
// IQ4 code and scale, every grid point, sign pattern and scale of the IQ types.
std::vector<uint8_t> RandomWeights(GgmlType type, int64_t rows, int64_t cols, bool raw) {
  const int64_t n = rows * RowBytes(type, cols) / BlockBytes(type);
  std::vector<uint8_t> w(n * BlockBytes(type));
  if (!raw) {
    const std::vector<float> f = Random(rows * cols, 0.05f);
    for (int64_t r = 0; r < rows; ++r) QuantizeRow(type, &f[r * cols], &w[r * RowBytes(type, cols)], cols);
    return w;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  for (int64_t b = 0; b < n; ++b) {
    uint8_t* blk = &w[b * BlockBytes(type)];
    const f16_bits d = F32ToF16(scale(rng)), dmin = F32ToF16(scale(rng));
    if (type == GgmlType::kQ4_K || type == GgmlType::kQ5_K) {
      std::memcpy(blk, &d, 2);
      std::memcpy(blk + 2, &dmin, 2);
    } else if (type == GgmlType::kQ6_K) {
      std::memcpy(blk + 208, &d, 2);
    } else if (type == GgmlType::kQ3_K) {
      std::memcpy(blk + 108, &d, 2);
    } else if (type == GgmlType::kQ2_K) {
      std::memcpy(blk + 80, &d, 2);
      std::memcpy(blk + 82, &dmin, 2);
    } else {  // the others: d first; Q4_1 and Q5_1 then m
      std::memcpy(blk, &d, 2);
      if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1) std::memcpy(blk + 2, &dmin, 2);
    }
  }
  return w;
}

// GGUF blocks -> device layout, with the repack kernel's per-block function.
std::vector<uint8_t> Repack(GgmlType type, const std::vector<uint8_t>& w) {
  const int64_t n = w.size() / BlockBytes(type);
  std::vector<uint8_t> dev(w.size(), 0xAB);
  for (int64_t b = 0; b < n; ++b) {
    const uint8_t* src = &w[b * BlockBytes(type)];
    switch (type) {
      case GgmlType::kQ2_K:
        cuda::RepackQ2_KBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kQ3_K:
        cuda::RepackQ3_KBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kQ4_K:
        cuda::RepackQ4_KBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kQ5_K:
        cuda::RepackQ5_KBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kQ6_K:
        cuda::RepackQ6_KBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kIQ4_XS:
        cuda::RepackIQ4_XSBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kIQ2_XXS:
        cuda::RepackIQ2_XXSBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kIQ2_XS:
        cuda::RepackIQ2_XSBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kIQ3_XXS:
        cuda::RepackIQ3_XXSBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kIQ3_S:
        cuda::RepackIQ3_SBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kIQ2_S:
        cuda::RepackIQ2_SBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kIQ1_S:
        cuda::RepackIQ1_SBlock(src, dev.data(), n, b);
        break;
      case GgmlType::kQ5_0:
        cuda::RepackQ5_0Block(src, dev.data(), n, b);
        break;
      case GgmlType::kQ4_1:
        cuda::RepackQ4_1Block(src, dev.data(), n, b);
        break;
      case GgmlType::kQ5_1:
        cuda::RepackQ5_1Block(src, dev.data(), n, b);
        break;
      default:
        cuda::RepackTable4Block(src, dev.data(), n, b);
        break;
    }
  }
  return dev;
}

// A CPU Q8_K row in the device layout: quants and bsums in the row, d separately.
void ToDeviceQ8_K(const std::vector<BlockQ8_K>& a, int64_t cols, std::vector<uint8_t>* row, std::vector<float>* d) {
  row->assign(cuda::Q8_KRowBytes(cols), 0xAB);
  d->assign(cols / kKBlock, NAN);
  for (int64_t e = 0; e < cols; ++e)
    (*row)[cuda::Q8_KQuantOffset(e)] = static_cast<uint8_t>(a[e / kKBlock].qs[e % kKBlock]);
  for (int64_t b = 0; b < cols / kKBlock; ++b) {
    std::memcpy(&(*row)[cuda::Q8_KBsumsOffset(cols, b)], a[b].bsums, 32);
    (*d)[b] = a[b].d;
  }
}

// kquant_quantize.cu lane by lane: lane l of the block's warp holds elements 8l .. 8l + 7.
void EmulateQuantizeQ8_K(const float* x, int64_t cols, uint8_t* row, float* d) {
  for (int64_t b = 0; b < cols / kKBlock; ++b) {
    const float* xb = x + b * kKBlock;
    float amax = 0.0f;
    for (int e = 0; e < kKBlock; ++e) amax = std::fmax(amax, std::fabs(xb[e]));
    int16_t* bsums = reinterpret_cast<int16_t*>(row + cuda::Q8_KBsumsOffset(cols, b));
    if (amax == 0.0f) {
      for (int e = 0; e < kKBlock; ++e) row[cuda::Q8_KQuantOffset(b * kKBlock + e)] = 0;
      for (int j = 0; j < 16; ++j) bsums[j] = 0;
      d[b] = 0.0f;
      continue;
    }
    int first = 0;
    while (std::fabs(xb[first]) != amax) ++first;
    const float iscale = -127.0f / xb[first];
    int sums[32] = {};
    for (int lane = 0; lane < 32; ++lane) {
      uint32_t packed[2] = {0, 0};
      for (int k = 0; k < 8; ++k) {
        const float p = iscale * xb[8 * lane + k];
        const int q = std::min(127, static_cast<int>(std::nearbyint(p)));
        sums[lane] += q;
        packed[k / 4] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (k % 4));
      }
      std::memcpy(row + cuda::Q8_KQuantOffset(b * kKBlock + 8 * lane), &packed[0], 4);
      std::memcpy(row + cuda::Q8_KQuantOffset(b * kKBlock + 8 * lane + 4), &packed[1], 4);
    }
    for (int j = 0; j < 16; ++j) bsums[j] = static_cast<int16_t>(sums[2 * j] + sums[2 * j + 1]);
    d[b] = 1.0f / iscale;
  }
}

// kquant_dot.cuh for one row (blocks b_row .. b_row + nb of a matrix of n blocks) and one
// activation row: lane g's chain over the blocks, then the CPU's trees.
float EmulateRowDot(GgmlType type, const uint8_t* m, int64_t n, int64_t b_row, int64_t nb, const uint8_t* act,
                    const float* act_d, int64_t stride) {
  float acc[8] = {}, acc_m[4] = {};
  float acc_m1 = 0.0f;  // Q5_K's one dmin chain, IQ1_S's offsets chain (lane 0)
  for (int64_t bi = 0; bi < nb; ++bi) {
    const int64_t b = b_row + bi;
    const float ad = act_d[bi];
    for (int g = 0; g < 8; ++g) {
      const uint4 a0 = Load<uint4>(act + cuda::Q8_KLaneOffset(bi, g)),
                  a1 = Load<uint4>(act + cuda::Q8_KLaneOffset(bi, g) + 16);
      const uint8_t* bsums = act + cuda::Q8_KBsumsOffset(stride, bi);
      if (type == GgmlType::kQ4_K) {
        const uint4 header = Load<uint4>(m + cuda::Q4_KHeaderOffset(n, b));
        const cuda::Q4_KScales s = cuda::DecodeQ4_KScales(header);
        const float dw = F16ToF32(static_cast<f16_bits>(header.x & 0xffffu));
        const float dmin = F16ToF32(static_cast<f16_bits>(header.x >> 16));
        const int isum = cuda::Q4_KLaneSum(Load<uint4>(m + cuda::Q4_KQsOffset(b, g)), s, a0, a1);
        const float dd = dw * ad;
        acc[g] = std::fma(dd, static_cast<float>(isum), acc[g]);
        if (g < 4) {
          const float ddmin = dmin * ad;
          const int msum = cuda::Q4_KMinLaneSum(s, g, Load<uint2>(bsums + 8 * g));
          acc_m[g] = std::fma(ddmin, static_cast<float>(msum), acc_m[g]);
        }
      } else if (type == GgmlType::kQ5_K) {
        const uint4 header = Load<uint4>(m + cuda::Q5_KHeaderOffset(n, b));
        const cuda::Q4_KScales s = cuda::DecodeQ4_KScales(header);
        const float dw = F16ToF32(static_cast<f16_bits>(header.x & 0xffffu));
        const float dmin = F16ToF32(static_cast<f16_bits>(header.x >> 16));
        const int isum = cuda::Q5_KLaneSum(Load<uint4>(m + cuda::Q5_KQsOffset(b, g)),
                                           Load<uint32_t>(m + cuda::Q5_KQhOffset(n, b, g)), s, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
        if (g == 0) {
          const int msum = cuda::Q5_KMinSum(s, Load<uint4>(bsums), Load<uint4>(bsums + 16));
          acc_m1 = std::fma(-(dmin * ad), static_cast<float>(msum), acc_m1);
        }
      } else if (type == GgmlType::kQ3_K) {
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::Q3_KDOffset(n, b)));
        const int isum = cuda::Q3_KLaneSum(Load<uint2>(m + cuda::Q3_KQsOffset(b, g)),
                                           Load<uint32_t>(m + cuda::Q3_KHmaskOffset(n, b, g)),
                                           Load<uint3>(m + cuda::Q3_KScalesOffset(n, b)), g, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
      } else if (type == GgmlType::kQ2_K) {
        const uint4 sc = Load<uint4>(m + cuda::Q2_KScalesOffset(n, b));
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::Q2_KDOffset(n, b)));
        const float dmin = F16ToF32(Load<f16_bits>(m + cuda::Q2_KDOffset(n, b) + 2));
        const int msum = cuda::Q2_KMinLaneSum(sc, g, Load<uint32_t>(bsums + 4 * g));
        acc[g] = std::fma(-(ad * dmin), static_cast<float>(msum), acc[g]);
        const int isum = cuda::Q2_KLaneSum(Load<uint2>(m + cuda::Q2_KQsOffset(b, g)), sc, g, a0, a1);
        acc[g] = std::fma(ad * dw, static_cast<float>(isum), acc[g]);
      } else if (type == GgmlType::kIQ4_XS) {
        const uint2 header = Load<uint2>(m + cuda::IQ4_XSHeaderOffset(n, b));
        const float dw = F16ToF32(static_cast<f16_bits>(header.x & 0xffffu));
        const int isum = cuda::IQ4_XSLaneSum(Load<uint4>(m + cuda::IQ4_XSQsOffset(b, g)), header, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
      } else if (type == GgmlType::kIQ2_XS) {
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::IQ2_XSDOffset(n, b)));
        const int isum = cuda::IQ2_XSLaneSum(Load<uint4>(m + cuda::IQ2_XSWordsOffset(b, g)),
                                             Load<uint2>(m + cuda::IQ2_XSScalesOffset(n, b)), g, kIQ2_XSGrid, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
      } else if (type == GgmlType::kIQ3_XXS) {
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::IQ3_XXSDOffset(n, b)));
        const uint8_t* words = m + cuda::IQ3_XXSWordsOffset(n, b);
        const int isum = cuda::IQ3_XXSLaneSum(Load<uint2>(m + cuda::IQ3_XXSIndexOffset(b, g)), Load<uint4>(words),
                                              Load<uint4>(words + 16), g, kIQ3_XXSGrid, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
      } else if (type == GgmlType::kIQ3_S) {
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::IQ3_SDOffset(n, b)));
        const int isum = cuda::IQ3_SLaneSum(Load<uint2>(m + cuda::IQ3_SIndexOffset(b, g)),
                                            Load<uint2>(m + cuda::IQ3_SSignsOffset(n, b, g)),
                                            Load<uint2>(m + cuda::IQ3_SQhOffset(n, b)),
                                            Load<uint32_t>(m + cuda::IQ3_SScalesOffset(n, b)), g, kIQ3_SGrid, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
      } else if (type == GgmlType::kIQ2_S) {
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::IQ2_SDOffset(n, b)));
        const int isum = cuda::IQ2_SLaneSum(Load<uint4>(m + cuda::IQ2_SWordsOffset(b, g)),
                                            Load<uint4>(m + cuda::IQ2_SHeaderOffset(n, b)), g, kIQ2_SGrid, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
      } else if (type == GgmlType::kIQ1_S) {
        const float dd = F16ToF32(Load<f16_bits>(m + cuda::IQ1_SDOffset(n, b))) * ad;
        const uint4 qh = Load<uint4>(m + cuda::IQ1_SQhOffset(n, b));
        const int isum = cuda::IQ1_SLaneSum(Load<uint2>(m + cuda::IQ1_SIndexOffset(b, g)), qh, g, kIQ1_SGrid, a0, a1);
        acc[g] = std::fma(dd, static_cast<float>(isum), acc[g]);
        if (g == 0) {
          const int osum = cuda::IQ1_SOffsetSum(qh, Load<uint4>(bsums), Load<uint4>(bsums + 16));
          acc_m1 = std::fma(dd, static_cast<float>(osum), acc_m1);
        }
      } else if (type == GgmlType::kIQ2_XXS) {
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::IQ2_XXSDOffset(n, b)));
        const uint8_t* words = m + cuda::IQ2_XXSWordsOffset(n, b);
        const int isum = cuda::IQ2_XXSLaneSum(Load<uint2>(m + cuda::IQ2_XXSIndexOffset(b, g)), Load<uint4>(words),
                                              Load<uint4>(words + 16), g, kIQ2_XXSGrid, a0, a1);
        acc[g] = std::fma(dw * ad, static_cast<float>(isum), acc[g]);
      } else {
        const float dw = F16ToF32(Load<f16_bits>(m + cuda::Q6_KDOffset(n, b)));
        const int isum =
            cuda::Q6_KLaneSum(Load<uint4>(m + cuda::Q6_KQlOffset(b, g)), Load<uint2>(m + cuda::Q6_KQhOffset(n, b, g)),
                              Load<uint4>(m + cuda::Q6_KScalesOffset(n, b)), a0, a1, g, Load<uint32_t>(bsums + 4 * g));
        const float dd = dw * ad;
        acc[g] = std::fma(dd, static_cast<float>(isum), acc[g]);
      }
    }
  }
  // KQuantReduce8: shuffles down by 4, 2, 1; KQuantReduce4: by 2, 1.
  float s4[4], s2[2];
  for (int i = 0; i < 4; ++i) s4[i] = acc[i] + acc[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  const float sum = s2[0] + s2[1];
  if (type == GgmlType::kQ6_K || type == GgmlType::kIQ4_XS || type == GgmlType::kQ3_K || type == GgmlType::kQ2_K ||
      type == GgmlType::kIQ3_S)
    return sum;
  if (type == GgmlType::kQ5_K) return sum + acc_m1;
  if (type == GgmlType::kIQ1_S) {
    volatile float offsets = cuda::kIQ1_SDelta * acc_m1;  // rounded apart, as the kernel's __fmul_rn
    return sum + offsets;
  }
  if (type == GgmlType::kIQ2_XXS || type == GgmlType::kIQ2_XS || type == GgmlType::kIQ2_S) return 0.125f * sum;
  if (type == GgmlType::kIQ3_XXS) return 0.25f * sum;
  const float m0 = acc_m[0] + acc_m[2], m1 = acc_m[1] + acc_m[3];
  const float sum_m = m0 + m1;
  return sum - sum_m;
}

// Table4GroupDots (kquant_dot.cuh) for one Q4_0 / IQ4_NL row against one Q8_0 activation row in
// the device layout (device_layout.cuh; f32 scales): per block the 8 lanes' parts added (the
// shuffles; exact in any order), then the row's fma chain.
float EmulateTable4RowDot(GgmlType type, const uint8_t* m, int64_t n, int64_t b_row, int64_t nb, const uint8_t* act,
                          const float* act_d, int64_t stride) {
  float acc = 0.0f;
  for (int64_t bi = 0; bi < nb; ++bi) {
    const int64_t b = b_row + bi;
    int isum = 0;
    for (int g = 0; g < 8; ++g) {
      const uint32_t codes = Load<uint16_t>(m + cuda::Table4CodesOffset(b, g));
      const uint32_t a = Load<uint32_t>(act + cuda::Q8_0QuantOffset(32 * bi + 4 * g, stride / 32));
      isum += type == GgmlType::kIQ4_NL ? cuda::Table4LanePart<true>(codes, a) : cuda::Table4LanePart<false>(codes, a);
    }
    const float dw = F16ToF32(Load<f16_bits>(m + cuda::Table4DOffset(n, b)));
    acc = std::fma(static_cast<float>(isum), dw * act_d[bi], acc);
  }
  return acc;
}

// Table4GroupDots' Q5_0 path for one row: lane g's chain over the blocks, then the 8-lane tree.
float EmulateQ5_0RowDot(const uint8_t* m, int64_t n, int64_t b_row, int64_t nb, const uint8_t* act, const float* act_d,
                        int64_t stride) {
  float acc[8] = {};
  for (int64_t bi = 0; bi < nb; ++bi) {
    const int64_t b = b_row + bi;
    const float dw = F16ToF32(Load<f16_bits>(m + cuda::Q5_0DOffset(n, b)));
    const uint32_t qh = Load<uint32_t>(m + cuda::Q5_0QhOffset(n, b));
    for (int g = 0; g < 8; ++g) {
      const uint32_t codes = Load<uint16_t>(m + cuda::Table4CodesOffset(b, g));
      const uint32_t a = Load<uint32_t>(act + cuda::Q8_0QuantOffset(32 * bi + 4 * g, stride / 32));
      acc[g] = std::fma(dw * act_d[bi], static_cast<float>(cuda::Q5_0LaneSum(codes, qh, g, a)), acc[g]);
    }
  }
  float s4[4], s2[2];
  for (int i = 0; i < 4; ++i) s4[i] = acc[i] + acc[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  return s2[0] + s2[1];
}

// Table4GroupDots' Q4_1 / Q5_1 path for one row against a Q8_1 row (scales: d | s << 16 as f16
// bits): lane g's chain, lane 0's m * s chain, then the 8-lane tree plus that chain.
float EmulateQ5_1RowDot(GgmlType type, const uint8_t* m, int64_t n, int64_t b_row, int64_t nb, const uint8_t* act,
                        const uint32_t* act_ds, int64_t stride) {
  const bool five = type == GgmlType::kQ5_1;
  float acc[8] = {}, acc_m = 0.0f;
  for (int64_t bi = 0; bi < nb; ++bi) {
    const int64_t b = b_row + bi;
    const int64_t dm = five ? cuda::Q5_1DmOffset(n, b) : cuda::Q4_1DmOffset(n, b);
    const float dw = F16ToF32(Load<f16_bits>(m + dm)), mw = F16ToF32(Load<f16_bits>(m + dm + 2));
    const float da = F16ToF32(static_cast<f16_bits>(act_ds[bi] & 0xffffu));
    const float sa = F16ToF32(static_cast<f16_bits>(act_ds[bi] >> 16));
    const uint32_t qh = five ? Load<uint32_t>(m + cuda::Q5_1QhOffset(n, b)) : 0u;
    for (int g = 0; g < 8; ++g) {
      const uint32_t codes = Load<uint16_t>(m + cuda::Table4CodesOffset(b, g));
      const uint32_t a = Load<uint32_t>(act + cuda::Q8_0QuantOffset(32 * bi + 4 * g, stride / 32));
      acc[g] = std::fma(dw * da, static_cast<float>(cuda::Q5_1LaneSum(codes, qh, g, a)), acc[g]);
    }
    acc_m = std::fma(mw, sa, acc_m);
  }
  float s4[4], s2[2];
  for (int i = 0; i < 4; ++i) s4[i] = acc[i] + acc[i + 4];
  for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
  return (s2[0] + s2[1]) + acc_m;
}

// A CPU Q8_0 row in the device layout: quants interleaved by runs of 4 blocks, f32 scales.
void ToDeviceQ8_0(const std::vector<BlockQ8_0>& a, int64_t cols, std::vector<uint8_t>* row, std::vector<float>* d) {
  row->assign(cols, 0xAB);
  d->assign(cols / 32, NAN);
  for (int64_t e = 0; e < cols; ++e)
    (*row)[cuda::Q8_0QuantOffset(e, cols / 32)] = static_cast<uint8_t>(a[e / 32].qs[e % 32]);
  for (int64_t b = 0; b < cols / 32; ++b) (*d)[b] = F16ToF32(a[b].d);
}

TEST(KQuantLayout, RowBytesAndAlignment) {
  for (int64_t cols = 256; cols <= 8192; cols += 256) {
    EXPECT_EQ(cuda::ActRowBytes(cuda::kDevQ8_K, cols), cuda::Q8_KRowBytes(cols));
    EXPECT_EQ(cuda::Q8_KRowBytes(cols) % 16, 0) << cols;  // rows start 16-byte aligned
    EXPECT_LE(cuda::Q8_KRowBytes(cols), 4 * cols);        // fits where f32 activations fit
  }
  // Every byte of a block lands in one place: the interleaves are permutations.
  for (int words : {2, 4, 8}) {
    std::vector<int> seen(32 * words, 0);
    for (int j = 0; j < 32 * words; ++j) ++seen[cuda::LaneInterleave(j, words)];
    for (int j = 0; j < 32 * words; ++j) EXPECT_EQ(seen[j], 1) << words << " words, byte " << j;
  }
  for (GgmlType type : kTypes) {
    const std::vector<uint8_t> w = RandomWeights(type, 3, 512, true);
    const std::vector<uint8_t> dev = Repack(type, w);
    std::vector<uint8_t> a = w, b = dev;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    if (type == GgmlType::kIQ4_XS) continue;  // moves nibbles, checked below
    EXPECT_EQ(a, b) << TypeName(type) << ": the repack keeps every byte";
  }
  // Q4_0 / IQ4_NL: element e's code in lane e / 4's 2 bytes, nibble e % 4; d after the codes.
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kIQ4_NL}) {
    const std::vector<uint8_t> w = RandomWeights(type, 3, 96, true);
    const std::vector<uint8_t> dev = Repack(type, w);
    const int64_t n = 9;
    for (int64_t b = 0; b < n; ++b) {
      const uint8_t* blk = &w[b * cuda::kTable4BlockBytes];
      for (int e = 0; e < 32; ++e) {
        const int want = (blk[2 + e % 16] >> (e < 16 ? 0 : 4)) & 0xF;
        const uint16_t codes = Load<uint16_t>(&dev[cuda::Table4CodesOffset(b, e / 4)]);
        ASSERT_EQ((codes >> (4 * (e % 4))) & 0xF, want) << TypeName(type) << " block " << b << " element " << e;
      }
      ASSERT_EQ(std::memcmp(&dev[cuda::Table4DOffset(n, b)], blk, 2), 0) << TypeName(type) << " d of block " << b;
    }
  }
  // IQ4_XS: every code lands in one place: lane e / 4, word j / 2, byte e % 4, nibble j % 2.
  const std::vector<uint8_t> w = RandomWeights(GgmlType::kIQ4_XS, 2, 512, true);
  const std::vector<uint8_t> dev = Repack(GgmlType::kIQ4_XS, w);
  const int64_t n = 4;
  for (int64_t b = 0; b < n; ++b) {
    const BlockIQ4_XS& x = reinterpret_cast<const BlockIQ4_XS*>(w.data())[b];
    for (int e = 0; e < kKBlock; ++e) {
      const int j = e / 32, k = e % 32;
      const int want = (x.qs[16 * j + k % 16] >> (k < 16 ? 0 : 4)) & 0xF;
      const uint8_t byte = dev[cuda::IQ4_XSQsOffset(b, k / 4) + 4 * (j / 2) + k % 4];
      ASSERT_EQ((byte >> (4 * (j % 2))) & 0xF, want) << "block " << b << " element " << e;
    }
    ASSERT_EQ(std::memcmp(&dev[cuda::IQ4_XSHeaderOffset(n, b)], &x, 8), 0) << "header of block " << b;
  }
  static_assert(cuda::kIQ1_SDelta == kIQ1_SDelta);
  // The codebooks' words are blocks.h's values and q - 8.
  for (int q = 0; q < 16; ++q) {
    EXPECT_EQ(static_cast<int8_t>(cuda::Q4_0Word(q / 4) >> (8 * (q % 4))), q - 8) << q;
    EXPECT_EQ(static_cast<int8_t>(cuda::IQ4Word(q / 4) >> (8 * (q % 4))), kIQ4Values[q]) << q;
    const uint32_t codes = static_cast<uint32_t>(q) | ((15u - q) << 8) | (((q + 5) % 16u) << 16) | (7u << 24);
    const uint32_t v = cuda::IQ4Lookup4(codes);
    EXPECT_EQ(static_cast<int8_t>(v), kIQ4Values[q]);
    EXPECT_EQ(static_cast<int8_t>(v >> 8), kIQ4Values[15 - q]);
    EXPECT_EQ(static_cast<int8_t>(v >> 16), kIQ4Values[(q + 5) % 16]);
    EXPECT_EQ(static_cast<int8_t>(v >> 24), kIQ4Values[7]);
  }
}

TEST(KQuantLayout, Q8_KConversionMatchesCpu) {
  for (int64_t cols : {256, 512, 768, 2048, 4096}) {
    for (int variant = 0; variant < 5; ++variant) {
      std::vector<float> x = Random(cols, 3.0f);
      if (variant == 1) std::fill(x.begin(), x.begin() + 256, 0.0f);  // an all-zero block
      if (variant == 2) {
        x[17] = -39.9f;
        x[200] = 40.0f;
      }  // the largest is positive
      if (variant == 3) {
        x[5] = 60.0f;
        x[9] = -60.0f;
      }  // ties: the first wins
      if (variant == 4) {
        x[3] = -70.0f;
        x[8] = 70.0f;
      }
      std::vector<BlockQ8_K> cpu(cols / kKBlock);
      QuantizeRowQ8_K(x.data(), cpu.data(), cols);
      std::vector<uint8_t> want_row;
      std::vector<float> want_d;
      ToDeviceQ8_K(cpu, cols, &want_row, &want_d);
      std::vector<uint8_t> got_row(cuda::Q8_KRowBytes(cols), 0xAB);
      std::vector<float> got_d(cols / kKBlock, NAN);
      EmulateQuantizeQ8_K(x.data(), cols, got_row.data(), got_d.data());
      for (size_t i = 0; i < want_row.size(); ++i)
        ASSERT_EQ(got_row[i], want_row[i]) << "cols " << cols << " variant " << variant << " byte " << i;
      for (size_t b = 0; b < want_d.size(); ++b)
        ASSERT_EQ(got_d[b], want_d[b]) << "cols " << cols << " variant " << variant << " block " << b;
    }
  }
}

TEST(KQuantLayout, LaneDotsMatchCpuKernels) {
  int checked = 0;
  for (GgmlType type : kTypes) {
    for (int64_t cols : {256, 512, 768, 1024, 2048, 4096}) {
      for (int64_t rows : {1, 5, 33}) {
        for (bool raw : {false, true}) {
          const std::vector<uint8_t> w = RandomWeights(type, rows, cols, raw);
          const std::vector<uint8_t> dev = Repack(type, w);
          const int64_t nb = cols / kKBlock, n = rows * nb, rb = RowBytes(type, cols);
          for (int t = 0; t < 3; ++t) {
            std::vector<float> x = Random(cols, t == 2 ? 50.0f : 1.0f);
            std::vector<BlockQ8_K> a(nb);
            QuantizeRowQ8_K(x.data(), a.data(), cols);
            if (t == 2) {  // extreme activations: every quant +-127
              for (int64_t b = 0; b < nb; ++b)
                for (int j = 0; j < 16; ++j) {
                  int s = 0;
                  for (int i = 0; i < 16; ++i) s += a[b].qs[16 * j + i] = (i + j) % 3 == 0 ? -127 : 127;
                  a[b].bsums[j] = static_cast<int16_t>(s);
                }
            }
            std::vector<float> want(rows), want_avx2(rows);
            VecDotRows(type, w.data(), rows, a.data(), cols, want.data());
            VecDotRowsWith(KernelVariant::kAvx2, type, w.data(), rows, a.data(), cols, want_avx2.data());
            std::vector<uint8_t> act;
            std::vector<float> act_d;
            ToDeviceQ8_K(a, cols, &act, &act_d);
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(want[r], want_avx2[r]) << "CPU variants differ: " << TypeName(type) << " row " << r;
              const float got = EmulateRowDot(type, dev.data(), n, r * nb, nb, act.data(), act_d.data(), cols);
              ASSERT_EQ(got, want[r]) << TypeName(type) << " " << rows << "x" << cols << (raw ? " raw" : "")
                                      << " token " << t << " row " << r << " (CPU row dot "
                                      << VecDot(type, &w[r * rb], a.data(), cols) << ")";
              ++checked;
            }
          }
        }
      }
    }
  }
  std::printf("%d row dots equal\n", checked);
}

// One int8 mma.m16n8k32 of a warp as the PTX ISA defines its fragments: a[lane][4], b[lane][2] in,
// c[lane][4] out (row gid / gid + 8, token 2 tig / 2 tig + 1).
void EmulateMmaS8(const uint32_t (&a)[32][4], const uint32_t (&b)[32][2], int (&c)[32][4]) {
  int8_t am[16][32], bm[32][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int gid = lane / 4, tig = lane % 4;
    for (int j = 0; j < 4; ++j) {
      const auto byte = [&](uint32_t w) { return static_cast<int8_t>((w >> (8 * j)) & 0xffu); };
      am[gid][4 * tig + j] = byte(a[lane][0]);
      am[gid + 8][4 * tig + j] = byte(a[lane][1]);
      am[gid][16 + 4 * tig + j] = byte(a[lane][2]);
      am[gid + 8][16 + 4 * tig + j] = byte(a[lane][3]);
      bm[4 * tig + j][gid] = byte(b[lane][0]);
      bm[16 + 4 * tig + j][gid] = byte(b[lane][1]);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int gid = lane / 4, tig = lane % 4;
    for (int i = 0; i < 4; ++i) {
      const int row = gid + (i >= 2 ? 8 : 0), col = 2 * tig + i % 2;
      int sum = 0;
      for (int k = 0; k < 32; ++k) sum += am[row][k] * bm[k][col];
      c[lane][i] = sum;
    }
  }
}

// A warp's tile: 16 rows of `type` over `cols` columns (file and device layouts) and 8 Q8_K
// tokens (CPU blocks and device layout; token 7's activations 50 times larger), as the tensor-core
// tests below drive them.
struct WarpTile {
  static constexpr int kRows = 16, kTokens = 8;
  GgmlType type;
  int64_t cols, nb, n;  // blocks per row, in the matrix
  bool raw;
  std::vector<uint8_t> w, dev;
  std::vector<std::vector<BlockQ8_K>> a;
  std::vector<std::vector<uint8_t>> act;
  std::vector<std::vector<float>> act_d;

  WarpTile(GgmlType type_, int64_t cols_, bool raw_)
      : type(type_),
        cols(cols_),
        nb(cols / kKBlock),
        n(kRows * nb),
        raw(raw_),
        w(RandomWeights(type, kRows, cols, raw)),
        dev(Repack(type, w)),
        a(kTokens, std::vector<BlockQ8_K>(nb)),
        act(kTokens),
        act_d(kTokens) {
    for (int t = 0; t < kTokens; ++t) {
      const std::vector<float> x = Random(cols, t == 7 ? 50.0f : 1.0f);
      QuantizeRowQ8_K(x.data(), a[t].data(), cols);
      ToDeviceQ8_K(a[t], cols, &act[t], &act_d[t]);
    }
  }
  // Token t's Q8_K words of lane `lane` in block bi: groups 0..3 (half 0) or 4..7 (half 1).
  uint4 Quants(int t, int64_t bi, int lane, int half) const {
    return Load<uint4>(&act[t][cuda::Q8_KLaneOffset(bi, lane) + 16 * half]);
  }
  const uint8_t* Bsums(int t, int64_t bi) const { return &act[t][cuda::Q8_KBsumsOffset(cols, bi)]; }
  std::string Where(int64_t bi, int r, int t) const {
    return std::string(TypeName(type)) + " " + std::to_string(cols) + " cols" + (raw ? " raw" : "") + " block " +
           std::to_string(bi) + " row " + std::to_string(r) + " token " + std::to_string(t);
  }
  // Each output within 1e-5 of the CPU kernel's, relative to the token's largest output.
  void ExpectNearCpu(const float (&got)[kRows][kTokens]) const {
    for (int t = 0; t < kTokens; ++t) {
      std::vector<float> want(kRows);
      VecDotRows(type, w.data(), kRows, a[t].data(), cols, want.data());
      float largest = 0.0f;
      for (float v : want) largest = std::max(largest, std::fabs(v));
      for (int r = 0; r < kRows; ++r) EXPECT_NEAR(got[r][t], want[r], 1e-5f * largest + 1e-30f) << Where(-1, r, t);
    }
  }
};

// The fast Q4_K and Q5_K tensor-core products (mma_kquant.cuh, as mma_kquant_tiles.cuh drives them)
// for 16 rows and 8 tokens, a warp's mma fragments emulated: each block's integer sums equal the
// CPU lane sums' total (Q4_KLaneSum or Q5_KLaneSum over the 8 lanes, Q5_KMinSum), which pins the
// fragments' layout; each output's chain is within 1e-5 of the CPU kernel's result, relative to the
// largest output.
TEST(KQuantLayout, Q4_KAndQ5_KTensorCoreFragmentsMatchCpu) {
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ5_K})
    for (int64_t cols : {256, 1024, 2816}) {
      for (bool raw : {false, true}) {
        const bool q5 = type == GgmlType::kQ5_K;
        const WarpTile c(type, cols, raw);
        float got[WarpTile::kRows][WarpTile::kTokens] = {};
        for (int64_t bi = 0; bi < c.nb; ++bi) {
          const auto qs = [&](int r, int lane) { return Load<uint4>(&c.dev[cuda::Q4_KQsOffset(r * c.nb + bi, lane)]); };
          const auto qh = [&](int r, int lane) {
            return q5 ? Load<uint32_t>(&c.dev[cuda::Q5_KQhOffset(c.n, r * c.nb + bi, lane)]) : 0u;
          };
          const auto header = [&](int r) {
            const int64_t b = r * c.nb + bi;
            return Load<uint4>(&c.dev[q5 ? cuda::Q5_KHeaderOffset(c.n, b) : cuda::Q4_KHeaderOffset(c.n, b)]);
          };
          const auto codes = [&](int r, int lane, int g) {
            return q5 ? cuda::Q5_KSubBlockCodes(qs(r, lane), qh(r, lane), g) : cuda::Q4_KSubBlockCodes(qs(r, lane), g);
          };
          int isum[WarpTile::kRows][WarpTile::kTokens] = {};
          for (int g = 0; g < 8; ++g) {
            uint32_t af[32][4], bf[32][2];
            for (int lane = 0; lane < 32; ++lane) {
              const int gid = lane / 4, tig = lane % 4;
              af[lane][0] = codes(gid, tig, g);
              af[lane][1] = codes(gid + 8, tig, g);
              af[lane][2] = codes(gid, tig + 4, g);
              af[lane][3] = codes(gid + 8, tig + 4, g);
              bf[lane][0] = cuda::Q8_KSubBlockQuants(c.Quants(gid, bi, tig, 0), c.Quants(gid, bi, tig, 1), g);
              bf[lane][1] = cuda::Q8_KSubBlockQuants(c.Quants(gid, bi, tig + 4, 0), c.Quants(gid, bi, tig + 4, 1), g);
            }
            int mma[32][4];
            EmulateMmaS8(af, bf, mma);
            for (int lane = 0; lane < 32; ++lane)
              for (int i = 0; i < 4; ++i) {
                const int r = lane / 4 + (i >= 2 ? 8 : 0), t = 2 * (lane % 4) + i % 2;
                isum[r][t] += cuda::Q4_KSubBlockScale(cuda::DecodeQ4_KScales(header(r)), g) * mma[lane][i];
              }
          }
          for (int r = 0; r < WarpTile::kRows; ++r)
            for (int t = 0; t < WarpTile::kTokens; ++t) {
              const cuda::Q4_KScales s = cuda::DecodeQ4_KScales(header(r));
              int lanes = 0;
              for (int lane = 0; lane < 8; ++lane) {
                const uint4 a0 = c.Quants(t, bi, lane, 0), a1 = c.Quants(t, bi, lane, 1);
                lanes += q5 ? cuda::Q5_KLaneSum(qs(r, lane), qh(r, lane), s, a0, a1)
                            : cuda::Q4_KLaneSum(qs(r, lane), s, a0, a1);
              }
              ASSERT_EQ(isum[r][t], lanes) << c.Where(bi, r, t);
              const int msum = cuda::Q5_KMinSum(s, Load<uint4>(c.Bsums(t, bi)), Load<uint4>(c.Bsums(t, bi) + 16));
              const uint32_t dd = header(r).x;
              got[r][t] = cuda::Q4_KTileStep(got[r][t], isum[r][t], msum, F16ToF32(static_cast<f16_bits>(dd & 0xffffu)),
                                             F16ToF32(static_cast<f16_bits>(dd >> 16)), c.act_d[t][bi]);
            }
        }
        c.ExpectNearCpu(got);
      }
    }
}

// The same for Q6_K (mma.m16n8k16 per 16-element sub-block, emulated as m16n8k32 with the second
// half of k zeroed): each block's integer sum equals the CPU lane sums' total (Q6_KLaneSum over the
// 8 lanes, the -32 offset taken out in both), each output within 1e-5 of the CPU kernel's.
TEST(KQuantLayout, Q6_KTensorCoreFragmentsMatchCpu) {
  for (int64_t cols : {256, 1024, 2816}) {
    for (bool raw : {false, true}) {
      const WarpTile c(GgmlType::kQ6_K, cols, raw);
      float got[WarpTile::kRows][WarpTile::kTokens] = {};
      for (int64_t bi = 0; bi < c.nb; ++bi) {
        const int64_t n = c.n, nb = c.nb;
        const auto ql = [&](int r, int lane) { return Load<uint4>(&c.dev[cuda::Q6_KQlOffset(r * nb + bi, lane)]); };
        const auto qh = [&](int r, int lane) { return Load<uint2>(&c.dev[cuda::Q6_KQhOffset(n, r * nb + bi, lane)]); };
        const auto scales = [&](int r) { return Load<uint4>(&c.dev[cuda::Q6_KScalesOffset(n, r * nb + bi)]); };
        int isum[WarpTile::kRows][WarpTile::kTokens] = {};
        for (int G = 0; G < 8; ++G)
          for (int second : {0, 1}) {  // sub-block 2G + second: lanes 4 second .. 4 second + 3
            uint32_t af[32][4] = {}, bf[32][2] = {};
            for (int lane = 0; lane < 32; ++lane) {
              const int gid = lane / 4, l = lane % 4 + 4 * second;
              af[lane][0] = cuda::Q6_KGroupCodes(ql(gid, l), qh(gid, l), G);
              af[lane][1] = cuda::Q6_KGroupCodes(ql(gid + 8, l), qh(gid + 8, l), G);
              bf[lane][0] = cuda::Q8_KSubBlockQuants(c.Quants(gid, bi, l, 0), c.Quants(gid, bi, l, 1), G);
            }
            int mma[32][4];
            EmulateMmaS8(af, bf, mma);
            for (int lane = 0; lane < 32; ++lane)
              for (int i = 0; i < 4; ++i) {
                const int r = lane / 4 + (i >= 2 ? 8 : 0), t = 2 * (lane % 4) + i % 2;
                isum[r][t] += cuda::ByteS(cuda::Word(scales(r), G / 2), 2 * (G % 2) + second) * mma[lane][i];
              }
          }
        for (int r = 0; r < WarpTile::kRows; ++r)
          for (int t = 0; t < WarpTile::kTokens; ++t) {
            const uint8_t* bsums = c.Bsums(t, bi);
            const int offset = cuda::Q6_KOffsetSum(scales(r), Load<uint4>(bsums), Load<uint4>(bsums + 16));
            int lanes = 0;
            for (int lane = 0; lane < 8; ++lane)
              lanes += cuda::Q6_KLaneSum(ql(r, lane), qh(r, lane), scales(r), c.Quants(t, bi, lane, 0),
                                         c.Quants(t, bi, lane, 1), lane, Load<uint32_t>(bsums + 4 * lane));
            ASSERT_EQ(isum[r][t] - 32 * offset, lanes) << c.Where(bi, r, t);
            const float d = F16ToF32(Load<f16_bits>(&c.dev[cuda::Q6_KDOffset(n, r * nb + bi)]));
            got[r][t] = cuda::Q6_KTileStep(got[r][t], isum[r][t], offset, d, c.act_d[t][bi]);
          }
      }
      c.ExpectNearCpu(got);
    }
  }
}

// A K-quant tile's staged block (KQuantTileLayout): block i of 64 rows and kBN tokens copied as
// the kernels copy it (CopyOf, the tokens' d by D) into a poisoned buffer, then every byte the
// warps read (Qs, Qh, Header, Quants, Bsums, D) equals the device layouts' bytes of that block, and
// the copies do not overlap (their regions cover each byte at most once).
template <GgmlType kType, int kBN>
void StagedBlockIsTheDeviceLayouts() {
  using L = cuda::KQuantTileLayout<kType == GgmlType::kQ4_K   ? cuda::kDevQ4_K
                                   : kType == GgmlType::kQ5_K ? cuda::kDevQ5_K
                                                              : cuda::kDevQ6_K,
                                   kBN>;
  constexpr int64_t cols = 768, nb = cols / kKBlock, n = L::kRows * nb;
  const std::vector<uint8_t> dev = Repack(kType, RandomWeights(kType, L::kRows, cols, true));
  std::vector<std::vector<uint8_t>> act(kBN);
  std::vector<std::vector<float>> act_d(kBN);
  for (int t = 0; t < kBN; ++t) {
    std::vector<BlockQ8_K> a(nb);
    QuantizeRowQ8_K(Random(cols, 1.0f).data(), a.data(), cols);
    ToDeviceQ8_K(a, cols, &act[t], &act_d[t]);
  }
  const bool q5 = kType == GgmlType::kQ5_K, q6 = kType == GgmlType::kQ6_K;
  // Block b's bytes in the device layouts: codes (lane `lane`'s), qh (lane `lane`'s), header / scales.
  const auto codes_at = [&](int64_t b, int lane) {
    return q6 ? cuda::Q6_KQlOffset(b, lane) : q5 ? cuda::Q5_KQsOffset(b, lane) : cuda::Q4_KQsOffset(b, lane);
  };
  const auto qh_at = [&](int64_t b, int lane) {
    return q6 ? cuda::Q6_KQhOffset(n, b, lane) : cuda::Q5_KQhOffset(n, b, lane);
  };
  const auto header_at = [&](int64_t b) {
    return q6 ? cuda::Q6_KScalesOffset(n, b) : q5 ? cuda::Q5_KHeaderOffset(n, b) : cuda::Q4_KHeaderOffset(n, b);
  };
  for (int64_t i = 0; i < nb; ++i) {
    std::vector<uint8_t> buffer(L::kBufferBytes, 0xAB);
    std::vector<int> written(L::kBufferBytes, 0);
    const auto put = [&](int dst, const uint8_t* src, int bytes) {
      std::memcpy(&buffer[dst], src, bytes);
      for (int b = 0; b < bytes; ++b) ++written[dst + b];
    };
    for (int idx = 0; idx < L::kCopies; ++idx) {
      const typename L::Copy c = L::CopyOf(idx, static_cast<int>(i));
      const uint8_t* start = c.part == L::kRowQs       ? &dev[codes_at(c.index * nb, 0)]
                             : c.part == L::kRowQh     ? &dev[qh_at(c.index * nb, 0)]
                             : c.part == L::kRowHeader ? &dev[header_at(c.index * nb)]
                             : c.part == L::kTokQuants ? act[c.index].data()
                                                       : &act[c.index][cuda::Q8_KBsumsOffset(cols, 0)];
      put(c.dst, start + c.src, 16);
    }
    for (int t = 0; t < kBN; ++t) put(L::D(t), reinterpret_cast<const uint8_t*>(&act_d[t][i]), 4);
    for (int w : written) ASSERT_LE(w, 1) << "overlapping copies";
    const auto expect = [&](int at, const uint8_t* want, int bytes, const char* what, int who) {
      ASSERT_EQ(std::memcmp(&buffer[at], want, bytes), 0)
          << TypeName(kType) << " " << kBN << " tokens, block " << i << ": " << what << " " << who;
    };
    const int64_t b0 = i;  // row r's block i is block r * nb + i
    for (int r = 0; r < L::kRows; ++r) {
      const int64_t b = r * nb + b0;
      for (int lane = 0; lane < 8; ++lane) {
        expect(L::Qs(r, lane), &dev[codes_at(b, lane)], 16, "row codes", r);
        if (q5 || q6) expect(L::Qh(r, lane), &dev[qh_at(b, lane)], L::kQhLane, "row qh", r);
      }
      expect(L::Header(r), &dev[header_at(b)], 16, "row header", r);
    }
    for (int t = 0; t < kBN; ++t) {
      for (int lane = 0; lane < 8; ++lane)
        for (int half = 0; half < 2; ++half)
          expect(L::Quants(t, lane, half), &act[t][cuda::Q8_KLaneOffset(i, lane) + 16 * half], 16, "token quants", t);
      expect(L::Bsums(t), &act[t][cuda::Q8_KBsumsOffset(cols, i)], 32, "token bsums", t);
      expect(L::D(t), reinterpret_cast<const uint8_t*>(&act_d[t][i]), 4, "token d", t);
    }
  }
}

TEST(KQuantLayout, TensorCoreTilesStageTheDeviceLayouts) {
  StagedBlockIsTheDeviceLayouts<GgmlType::kQ4_K, 32>();
  StagedBlockIsTheDeviceLayouts<GgmlType::kQ4_K, 64>();
  StagedBlockIsTheDeviceLayouts<GgmlType::kQ5_K, 32>();
  StagedBlockIsTheDeviceLayouts<GgmlType::kQ5_K, 64>();
  StagedBlockIsTheDeviceLayouts<GgmlType::kQ6_K, 32>();
  StagedBlockIsTheDeviceLayouts<GgmlType::kQ6_K, 64>();
}

// Q4_0 and IQ4_NL rows (Q8_0 activations), row counts that are and are not multiples of 8 (the
// CPU's 8-row and 1-row kernels, the same per-row chain), and Q5_0, Q4_1 and Q5_1 rows (the last
// two with Q8_1 activations, whose quants are Q8_0's), against the CPU kernels.
TEST(KQuantLayout, Table4LaneDotsMatchCpuKernels) {
  int checked = 0;
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kIQ4_NL, GgmlType::kQ5_0, GgmlType::kQ4_1, GgmlType::kQ5_1}) {
    const bool q8_1 = type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1;
    for (int64_t cols : {32, 96, 128, 160, 768, 2048}) {
      for (int64_t rows : {1, 8, 13, 33}) {
        for (bool raw : {false, true}) {
          const std::vector<uint8_t> w = RandomWeights(type, rows, cols, raw);
          const std::vector<uint8_t> dev = Repack(type, w);
          const int64_t nb = cols / 32, n = rows * nb;
          for (int t = 0; t < 3; ++t) {
            std::vector<float> x = Random(cols, t == 2 ? 50.0f : 1.0f);
            std::vector<BlockQ8_0> a(nb);
            std::vector<BlockQ8_1> a1(nb);
            QuantizeRow(GgmlType::kQ8_0, x.data(), a.data(), cols);
            QuantizeRow(GgmlType::kQ8_1, x.data(), a1.data(), cols);
            if (t == 2)  // extreme activations: every quant +-127
              for (int64_t b = 0; b < nb; ++b)
                for (int i = 0; i < 32; ++i) a[b].qs[i] = a1[b].qs[i] = (i + b) % 3 == 0 ? -127 : 127;
            const void* cpu_act = q8_1 ? static_cast<const void*>(a1.data()) : static_cast<const void*>(a.data());
            std::vector<float> want(rows), want_avx2(rows);
            VecDotRows(type, w.data(), rows, cpu_act, cols, want.data());
            VecDotRowsWith(KernelVariant::kAvx2, type, w.data(), rows, cpu_act, cols, want_avx2.data());
            std::vector<uint8_t> act;
            std::vector<float> act_d;
            ToDeviceQ8_0(a, cols, &act, &act_d);
            std::vector<uint32_t> act_ds(nb);  // Q8_1: d | s << 16; its quants are Q8_0's
            for (int64_t b = 0; b < nb; ++b) act_ds[b] = a1[b].d | (static_cast<uint32_t>(a1[b].s) << 16);
            for (int64_t r = 0; r < rows; ++r) {
              ASSERT_EQ(want[r], want_avx2[r]) << "CPU variants differ: " << TypeName(type) << " row " << r;
              const float got =
                  q8_1 ? EmulateQ5_1RowDot(type, dev.data(), n, r * nb, nb, act.data(), act_ds.data(), cols)
                  : type == GgmlType::kQ5_0
                      ? EmulateQ5_0RowDot(dev.data(), n, r * nb, nb, act.data(), act_d.data(), cols)
                      : EmulateTable4RowDot(type, dev.data(), n, r * nb, nb, act.data(), act_d.data(), cols);
              ASSERT_EQ(got, want[r]) << TypeName(type) << " " << rows << "x" << cols << (raw ? " raw" : "")
                                      << " token " << t << " row " << r;
              ++checked;
            }
          }
        }
      }
    }
  }
  std::printf("%d row dots equal\n", checked);
}

// kquant_dequant.cuh's formulas against DequantizeRow as compiled (GCC contracts Q4_K's
// d_j * q - min_j into an fma; d_j * q is exact, so fused or not is the same float).
TEST(KQuantLayout, EmbeddingDequantMatchesCpu) {
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    for (bool raw : {false, true}) {
      const int64_t rows = 20, cols = 1024;
      const std::vector<uint8_t> w = RandomWeights(type, rows, cols, raw);
      const int64_t rb = RowBytes(type, cols);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> want(cols);
        DequantizeRow(type, &w[r * rb], want.data(), cols);
        for (int64_t i = 0; i < cols; ++i) {
          const uint8_t* blk = &w[r * rb + (i / kKBlock) * BlockBytes(type)];
          const int e = static_cast<int>(i % kKBlock);
          float got;
          if (type == GgmlType::kQ4_K) {
            const int chunk = e / 64, high = (e % 64) / 32;
            uint8_t sc, m;
            Q4_KScaleMin(blk + 4, 2 * chunk + high, &sc, &m);
            const uint8_t qb = blk[16 + 32 * chunk + e % 32];
            const int q = high ? qb >> 4 : qb & 0xF;
            const float dj = F16ToF32(Load<f16_bits>(blk)) * static_cast<float>(sc);
            const float mj = F16ToF32(Load<f16_bits>(blk + 2)) * static_cast<float>(m);
            got = std::fma(dj, static_cast<float>(q), -mj);
            volatile float product = dj * static_cast<float>(q);
            ASSERT_EQ(product - mj, got) << "d_j * q is exact";
          } else {
            const int half = e / 128, group = (e % 128) / 32, l = e % 32;
            const uint8_t ql = blk[64 * half + l + 32 * (group & 1)];
            const int code =
                (group < 2 ? (ql & 0xF) : (ql >> 4)) | (((blk[128 + 32 * half + l] >> (2 * group)) & 3) << 4);
            const float dsc =
                F16ToF32(Load<f16_bits>(blk + 208)) * static_cast<float>(static_cast<int8_t>(blk[192 + e / 16]));
            got = dsc * static_cast<float>(code - 32);
          }
          ASSERT_EQ(got, want[i]) << TypeName(type) << (raw ? " raw" : "") << " row " << r << " element " << i;
        }
      }
    }
  }
}

// kquant_dequant.cuh's host/device functions for the other types, as they are.
TEST(KQuantLayout, EmbeddingDequantMatchesCpuForTheOtherTypes) {
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ5_K, GgmlType::kIQ4_XS, GgmlType::kIQ2_XXS,
                        GgmlType::kIQ2_XS, GgmlType::kIQ2_S, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S, GgmlType::kIQ1_S,
                        GgmlType::kQ4_0, GgmlType::kIQ4_NL, GgmlType::kQ5_0, GgmlType::kQ4_1, GgmlType::kQ5_1}) {
    for (bool raw : {false, true}) {
      const int64_t rows = 20, cols = 1024;
      const std::vector<uint8_t> w = RandomWeights(type, rows, cols, raw);
      const int64_t rb = RowBytes(type, cols);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<float> want(cols);
        DequantizeRow(type, &w[r * rb], want.data(), cols);
        for (int64_t i = 0; i < cols; ++i) {
          const uint8_t* row = &w[r * rb];
          const float got = type == GgmlType::kQ2_K      ? cuda::DequantQ2_K(row, i)
                            : type == GgmlType::kQ3_K    ? cuda::DequantQ3_K(row, i)
                            : type == GgmlType::kQ5_K    ? cuda::DequantQ5_K(row, i)
                            : type == GgmlType::kIQ4_XS  ? cuda::DequantIQ4_XS(row, i)
                            : type == GgmlType::kQ4_0    ? cuda::DequantTable4<false>(row, i)
                            : type == GgmlType::kIQ4_NL  ? cuda::DequantTable4<true>(row, i)
                            : type == GgmlType::kQ5_0    ? cuda::DequantQ5_0(row, i)
                            : type == GgmlType::kQ4_1    ? cuda::DequantQ5_1<false>(row, i)
                            : type == GgmlType::kQ5_1    ? cuda::DequantQ5_1<true>(row, i)
                            : type == GgmlType::kIQ2_XS  ? cuda::DequantIQ2_XS(row, i, kIQ2_XSGrid)
                            : type == GgmlType::kIQ3_XXS ? cuda::DequantIQ3_XXS(row, i, kIQ3_XXSGrid)
                            : type == GgmlType::kIQ3_S   ? cuda::DequantIQ3_S(row, i, kIQ3_SGrid)
                            : type == GgmlType::kIQ2_S   ? cuda::DequantIQ2_S(row, i, kIQ2_SGrid)
                            : type == GgmlType::kIQ1_S   ? cuda::DequantIQ1_S(row, i, kIQ1_SGrid)
                                                         : cuda::DequantIQ2_XXS(row, i, kIQ2_XXSGrid);
          ASSERT_EQ(got, want[i]) << TypeName(type) << (raw ? " raw" : "") << " row " << r << " element " << i;
        }
      }
    }
  }
  // f16 decoding on the host, every bit pattern but NaNs.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;
    ASSERT_EQ(cuda::HalfBitsToFloat(static_cast<uint16_t>(h)), F16ToF32(static_cast<f16_bits>(h))) << h;
  }
}

}  // namespace
}  // namespace mer
