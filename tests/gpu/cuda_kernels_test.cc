// Every kernel of the cuda backend against a plain CPU reference (the CPU engine's own row
// kernels and ops, services/compute/cpu/cpu_ops.h and common/quant/), swept over types and sizes,
// each with its error bound: activation conversion and matrix products bit-exact (they keep the
// CPU kernels' lane order; the fast tensor-core Q8_0 products within a stated bound), the Q8_K
// ones (the K-quants and IQ types) for dense mat-vec and the grouped experts too; norms, RoPE,
// attention and routing against double-precision references within relative L2 1e-6..1e-5 (the
// weights of preselected routes bit for bit against the CPU engine's formula); embedding rows
// exact. Fresh random
// inputs per case; outputs poisoned with NaN before each launch.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/quant/q8_k.h"
#include "common/quant/quant.h"
#include "services/compute/cpu/cpu_ops.h"
#include "services/compute/cuda/argmax.cuh"
#include "services/compute/cuda/attention.cuh"
#include "services/compute/cuda/cuda_check.cuh"
#include "services/compute/cuda/embed.cuh"
#include "services/compute/cuda/expert_product.cuh"
#include "services/compute/cuda/flash_attention.cuh"
#include "services/compute/cuda/kquant_layout.cuh"
#include "services/compute/cuda/matvec.cuh"
#include "services/compute/cuda/moe_experts.cuh"
#include "services/compute/cuda/moe_group.cuh"
#include "services/compute/cuda/qk_norm_rope.cuh"
#include "services/compute/cuda/quantize.cuh"
#include "services/compute/cuda/repack.cuh"
#include "services/compute/cuda/rms_norm.cuh"
#include "services/compute/cuda/router_topk.cuh"
#include "services/compute/sampler.h"

namespace mer {
namespace {

std::mt19937 rng(20261201);

std::vector<float> Random(int64_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

template <typename T>
T* ToDevice(const std::vector<T>& h) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, h.size() * sizeof(T))));
  CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}
template <typename T>
T* DeviceNaN(int64_t n) {  // poisoned output buffer
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, std::max<int64_t>(1, n) * sizeof(T)));
  CUDA_CHECK(cudaMemset(d, 0xff, n * sizeof(T)));
  return d;
}
template <typename T>
std::vector<T> ToHost(const T* d, int64_t n) {
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The types of 32-element blocks (or none) whose activations are their own, Q8_0 or Q8_1; Q4_0,
// Q5_0, Q4_1, Q5_1 and IQ4_NL take the 8-lane groups of kquant_dot.cuh's Table4GroupDots.
const GgmlType kTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ8_0,  GgmlType::kQ4_0,
                           GgmlType::kQ5_0, GgmlType::kQ4_1, GgmlType::kQ5_1, GgmlType::kIQ4_NL};

// Activations in device layout (device_layout.cuh) for n rows of `cols`.
struct DeviceAct {
  cuda::DevAct act;
  DeviceAct(GgmlType type, int64_t cols, int n) {
    act.type = static_cast<int>(type);
    act.stride = cols;
    act.data = DeviceNaN<uint8_t>(n * cols * 4);
    act.scales = DeviceNaN<float>(n * cols / 32 + 1);
  }
  ~DeviceAct() {
    CUDA_CHECK(cudaFree(act.data));
    CUDA_CHECK(cudaFree(act.scales));
  }
};

TEST(CudaKernels, QuantizeIsBitExact) {
  for (GgmlType w : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    const GgmlType at = ActivationTypeFor(w);
    // 19 rows: blocks of 8 rows, the last one partial.
    for (int64_t cols : {32, 96, 256, 768, 2048})
      for (int n : {5, 19}) {
        const std::vector<float> x = Random(n * cols, 3.0f);
        float* dx = ToDevice(x);
        DeviceAct a(at, cols, n);
        cuda::LaunchQuantize(dx, cols, n, cols, a.act, nullptr);
        const int64_t rb = cuda::ActRowBytes(a.act.type, cols);
        const std::vector<uint8_t> got = ToHost(a.act.data, n * rb);
        const std::vector<float> got_s = ToHost(a.act.scales, n * cols / 32);
        for (int t = 0; t < n; ++t) {
          std::vector<uint8_t> want(RowBytes(at, cols));
          QuantizeRow(at, &x[t * cols], want.data(), cols);
          if (at == GgmlType::kQ8_0) {
            const BlockQ8_0* b = reinterpret_cast<const BlockQ8_0*>(want.data());
            for (int64_t k = 0; k < cols / 32; ++k) {
              for (int j = 0; j < 32; ++j)  // device rows interleave runs of 4 blocks (device_layout.cuh)
                ASSERT_EQ(b[k].qs[j], static_cast<int8_t>(got[t * rb + cuda::Q8_0QuantOffset(k * 32 + j, cols / 32)]))
                    << "q8_0 cols " << cols << " block " << k;
              ASSERT_EQ(F16ToF32(b[k].d), got_s[t * (cols / 32) + k]);
            }
          } else {
            ASSERT_EQ(0, std::memcmp(want.data(), &got[t * rb], want.size())) << TypeName(at) << " cols " << cols;
          }
        }
        CUDA_CHECK(cudaFree(dx));
      }
  }
}

// Q8_1 conversion (the activations of Q4_1 and Q5_1) against QuantizeRowQ8_1: Q8_0's quants, and
// d and s as two f16 in each block's scales entry.
TEST(CudaKernels, QuantizeQ8_1IsBitExact) {
  for (int64_t cols : {32, 96, 256, 768, 2048})
    for (int n : {5, 19}) {  // 19: blocks of 8 rows, the last one partial
      std::vector<float> x = Random(n * cols, 3.0f);
      std::fill(x.begin(), x.begin() + 32, 0.0f);  // row 0, block 0: all zero
      float* dx = ToDevice(x);
      DeviceAct a(GgmlType::kQ8_1, cols, n);
      cuda::LaunchQuantize(dx, cols, n, cols, a.act, nullptr);
      const std::vector<uint8_t> got = ToHost(a.act.data, n * cols);
      const std::vector<float> got_s = ToHost(a.act.scales, n * cols / 32);
      for (int t = 0; t < n; ++t) {
        std::vector<BlockQ8_1> want(cols / 32);
        QuantizeRow(GgmlType::kQ8_1, &x[t * cols], want.data(), cols);
        for (int64_t k = 0; k < cols / 32; ++k) {
          for (int j = 0; j < 32; ++j)
            ASSERT_EQ(want[k].qs[j], static_cast<int8_t>(got[t * cols + cuda::Q8_0QuantOffset(k * 32 + j, cols / 32)]))
                << "q8_1 cols " << cols << " row " << t << " block " << k;
          uint32_t ds;
          std::memcpy(&ds, &got_s[t * (cols / 32) + k], 4);
          ASSERT_EQ(want[k].d, ds & 0xffffu) << "q8_1 d, cols " << cols << " row " << t << " block " << k;
          ASSERT_EQ(want[k].s, ds >> 16) << "q8_1 s, cols " << cols << " row " << t << " block " << k;
        }
      }
      CUDA_CHECK(cudaFree(dx));
    }
}

// The outputs that differ from the CPU's: any bit (tolerance 0), or by more than tolerance times
// the largest |CPU output|.
std::string Mismatch(const std::vector<float>& got, const std::vector<float>& want, int64_t rows,
                     double tolerance = 0) {
  double scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(double(v)));
  const double bound = tolerance * scale;
  int64_t count = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (tolerance == 0 ? !(got[i] == want[i]) : !(std::fabs(double(got[i]) - want[i]) <= bound)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++count;
    }
  if (count == 0) return "";
  std::ostringstream m;
  m.precision(9);
  m << count << " of " << want.size() << " differ; first at token " << first / rows << " row " << first % rows
    << ": got " << got[first] << ", CPU " << want[first];
  return m.str();
}

// Matrix-vector products of every type and a sweep of sizes and token counts, with and without
// a residual, against VecDot on the CPU-converted activations.
TEST(CudaKernels, MatvecMatchesCpuRowDots) {
  struct Size {
    int64_t rows, cols;
  };
  // Q8_0 three times: the dp4a kernels, then the exact and the fast tensor-core ones
  // (cuda::SetMultiTokenQ8_0); the fast ones within 1e-5 of the largest output, the rest bit for bit.
  using cuda::MultiTokenQ8_0;
  std::vector<std::pair<GgmlType, MultiTokenQ8_0>> runs;
  for (GgmlType type : kTypes) runs.push_back({type, MultiTokenQ8_0::kDp4a});
  runs.push_back({GgmlType::kQ8_0, MultiTokenQ8_0::kMmaExact});
  runs.push_back({GgmlType::kQ8_0, MultiTokenQ8_0::kMmaFast});
  for (const auto& [type, kernels] : runs) {
    cuda::SetMultiTokenQ8_0(kernels);
    const double tolerance = kernels == MultiTokenQ8_0::kMmaFast ? 1e-5 : 0;
    const char* which = kernels == MultiTokenQ8_0::kMmaFast    ? " (fast tensor cores) "
                        : kernels == MultiTokenQ8_0::kMmaExact ? " (tensor cores) "
                                                               : " ";
    // One token of Q8_0 with 4,096 cols takes the warp-per-row path (matvec.cu, warp_dot.cuh
    // WarpQ8_0Rows); the others the lane-group path. Several tokens of Q8_0 rows in multiples of
    // 16 take the tensor-core kernel (mma_q8_0.cuh; 160 and 96 columns: blocks past the last run of
    // 4), the others the staged dp4a kernel where the rows fit.
    for (Size sz : {Size{2, 32}, Size{67, 64}, Size{33, 160}, Size{256, 256}, Size{512, 768}, Size{1000, 2048},
                    Size{5, 128}, Size{300, 4096}, Size{3, 8192}, Size{48, 160}, Size{64, 96}, Size{16, 4096}}) {
      // 31 tokens: staged blocks of 8, 8, 8 and 7 tokens (passes of 8, and 4 + 2 + 1) where Q8_0 rows fit.
      for (int n : {1, 3, 9, 17, 31}) {
        const int64_t rb = RowBytes(type, sz.cols);
        const std::vector<float> wf = Random(sz.rows * sz.cols, 0.05f);
        std::vector<uint8_t> w(sz.rows * rb);
        for (int64_t r = 0; r < sz.rows; ++r) QuantizeRow(type, &wf[r * sz.cols], &w[r * rb], sz.cols);
        const std::vector<float> x = Random(n * sz.cols);
        const std::vector<float> res = Random(n * sz.rows);
        const GgmlType at = ActivationTypeFor(type);
        std::vector<float> want(n * sz.rows), want_res(n * sz.rows);
        std::vector<uint8_t> act(RowBytes(at, sz.cols));
        for (int t = 0; t < n; ++t) {
          QuantizeRow(at, &x[t * sz.cols], act.data(), sz.cols);
          for (int64_t r = 0; r < sz.rows; ++r) {
            // The CPU engine's row dot (cpu_engine.cc RowDots): ggml_vec_dot_f32's order for F32.
            want[t * sz.rows + r] = type == GgmlType::kF32 ? cpu::DotF32Ggml(reinterpret_cast<const float*>(&w[r * rb]),
                                                                             &x[t * sz.cols], sz.cols)
                                                           : VecDot(type, &w[r * rb], act.data(), sz.cols);
            want_res[t * sz.rows + r] = res[t * sz.rows + r] + want[t * sz.rows + r];
          }
        }
        uint8_t* raw = ToDevice(w);
        uint8_t* dw = DeviceNaN<uint8_t>(w.size());
        const cuda::RepackJob job{raw, dw, int64_t(w.size()), sz.cols};
        cuda::LaunchRepack(static_cast<int>(type), &job, 1, nullptr);
        float* dx = ToDevice(x);
        DeviceAct a(at, sz.cols, n);
        cuda::LaunchQuantize(dx, sz.cols, n, sz.cols, a.act, nullptr);
        float* out = DeviceNaN<float>(n * sz.rows);
        float* out_res = ToDevice(res);
        const cuda::DevMatrix m{static_cast<int>(type), sz.rows, sz.cols, dw};
        const cuda::MatvecOutput outs[2] = {{m, out, sz.rows, nullptr}, {m, out_res, sz.rows, out_res}};
        cuda::LaunchMatvec(outs, 2, a.act, n, nullptr);
        // Bit for bit: the kernels keep the CPU kernels' lanes and reduction order (warp_dot.cuh);
        // one token always takes them, also with the fast tensor-core kernels chosen.
        const double bound = n > 1 ? tolerance : 0;
        EXPECT_EQ(Mismatch(ToHost(out, n * sz.rows), want, sz.rows, bound), "")
            << TypeName(type) << which << sz.rows << "x" << sz.cols << " n " << n;
        EXPECT_EQ(Mismatch(ToHost(out_res, n * sz.rows), want_res, sz.rows, bound), "")
            << TypeName(type) << which << "residual " << sz.rows << "x" << sz.cols << " n " << n;
        for (void* p : {(void*)raw, (void*)dw, (void*)dx, (void*)out, (void*)out_res}) CUDA_CHECK(cudaFree(p));
      }
    }
  }
  cuda::SetMultiTokenQ8_0(MultiTokenQ8_0::kAuto);
}

TEST(CudaKernels, RmsNormMatchesCpu) {
  for (int64_t cols : {64, 768, 2048}) {
    const int n = 7;
    const std::vector<float> x = Random(n * cols, 2.0f), w = Random(cols);
    const std::vector<int32_t> rows = {6, 0, 3};
    std::vector<float> want(rows.size() * cols);
    for (size_t i = 0; i < rows.size(); ++i) cpu::RmsNorm(&x[rows[i] * cols], w.data(), 1e-6f, cols, &want[i * cols]);
    float* dx = ToDevice(x);
    float* dw = ToDevice(w);
    int32_t* dr = ToDevice(rows);
    float* y = DeviceNaN<float>(rows.size() * cols);
    cuda::LaunchRmsNorm(dx, cols, dr, rows.size(), cuda::MoeCombine{}, dw, 1e-6f, cols, y, cols, cuda::DevAct{},
                        nullptr);
    EXPECT_LE(RelL2(ToHost(y, rows.size() * cols), want), 1e-6) << cols;
    for (void* p : {(void*)dx, (void*)dw, (void*)dr, (void*)y}) CUDA_CHECK(cudaFree(p));
  }
}

// The norm that first adds the previous MoE block's output into the residual stream: x updated
// exactly as the CPU engine's combine (mul, then fma per expert in top-k order, then + x).
TEST(CudaKernels, RmsNormAddsMoeOutputExactly) {
  const int64_t cols = 768;
  const int n = 5, k = 3;
  const std::vector<float> x = Random(n * cols, 2.0f), w = Random(cols);
  const std::vector<float> eo = Random(n * k * cols), ew = Random(n * k, 0.3f);
  std::vector<float> want_x(x);
  for (int t = 0; t < n; ++t)
    for (int64_t i = 0; i < cols; ++i) {
      float acc = eo[(t * k) * cols + i] * ew[t * k];
      for (int j = 1; j < k; ++j) acc = std::fma(eo[(t * k + j) * cols + i], ew[t * k + j], acc);
      want_x[t * cols + i] = acc + x[t * cols + i];
    }
  std::vector<float> want_y(n * cols);
  for (int t = 0; t < n; ++t) cpu::RmsNorm(&want_x[t * cols], w.data(), 1e-6f, cols, &want_y[t * cols]);
  float* dx = ToDevice(x);
  float* dw = ToDevice(w);
  float* deo = ToDevice(eo);
  float* dew = ToDevice(ew);
  float* y = DeviceNaN<float>(n * cols);
  cuda::LaunchRmsNorm(dx, cols, nullptr, n, cuda::MoeCombine{deo, dew, k}, dw, 1e-6f, cols, y, cols, cuda::DevAct{},
                      nullptr);
  EXPECT_EQ(ToHost(dx, n * cols), want_x);
  EXPECT_LE(RelL2(ToHost(y, n * cols), want_y), 1e-6);
  for (void* p : {(void*)dx, (void*)dw, (void*)deo, (void*)dew, (void*)y}) CUDA_CHECK(cudaFree(p));
}

TEST(CudaKernels, EmbedRowsExact) {
  for (GgmlType type : {GgmlType::kF32,     GgmlType::kF16,    GgmlType::kBF16,   GgmlType::kQ8_0,    GgmlType::kQ2_K,
                        GgmlType::kQ3_K,    GgmlType::kQ4_K,   GgmlType::kQ5_K,   GgmlType::kQ6_K,    GgmlType::kIQ4_XS,
                        GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ2_S,  GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,
                        GgmlType::kIQ1_S,   GgmlType::kQ4_0,   GgmlType::kIQ4_NL, GgmlType::kQ5_0,    GgmlType::kQ4_1,
                        GgmlType::kQ5_1}) {
    const int64_t cols = 768, rows = 50;
    const int64_t rb = RowBytes(type, cols);
    const std::vector<float> tf = Random(rows * cols);
    std::vector<uint8_t> table(rows * rb);
    for (int64_t r = 0; r < rows; ++r) QuantizeRow(type, &tf[r * cols], &table[r * rb], cols);
    const std::vector<int32_t> ids = {3, 49, 0, 3};
    std::vector<float> want(ids.size() * cols);
    for (size_t i = 0; i < ids.size(); ++i) DequantizeRow(type, &table[ids[i] * rb], &want[i * cols], cols);
    uint8_t* dt = ToDevice(table);
    int32_t* di = ToDevice(ids);
    float* x = DeviceNaN<float>(want.size());
    cuda::LaunchEmbed(static_cast<int>(type), dt, rb, di, ids.size(), cols, x, nullptr);
    EXPECT_EQ(ToHost(x, want.size()), want) << TypeName(type);
    for (void* p : {(void*)dt, (void*)di, (void*)x}) CUDA_CHECK(cudaFree(p));
  }
}

// Routing: softmax, top-k (ties to the lower id) and renormalisation, as CpuEngine::MoE.
TEST(CudaKernels, RouterTopKMatchesCpu) {
  for (int ne : {8, 32, 128}) {
    for (int k : {1, 2, 8}) {
      for (bool norm : {true, false}) {
        const int n = 9;
        std::vector<float> logits = Random(n * ne, 2.0f);
        logits[3] = logits[5];  // a tie
        std::vector<int32_t> want_e(n * k);
        std::vector<float> want_w(n * k);
        for (int t = 0; t < n; ++t) {
          std::vector<double> p(ne);
          double mx = -INFINITY, sum = 0;
          for (int e = 0; e < ne; ++e) mx = std::max(mx, double(logits[t * ne + e]));
          for (int e = 0; e < ne; ++e) sum += p[e] = std::exp(double(logits[t * ne + e]) - mx);
          std::vector<int> order(ne);
          for (int e = 0; e < ne; ++e) order[e] = e;
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
          double ws = 0;
          for (int j = 0; j < k; ++j) ws += p[order[j]] / sum;
          for (int j = 0; j < k; ++j) {
            want_e[t * k + j] = order[j];
            want_w[t * k + j] = static_cast<float>(p[order[j]] / sum / (norm ? ws : 1.0));
          }
        }
        float* dl = ToDevice(logits);
        int32_t* de = DeviceNaN<int32_t>(n * k);
        float* dw = DeviceNaN<float>(n * k);
        cuda::LaunchRouterTopK(dl, n, ne, k, norm, de, dw, nullptr, nullptr, nullptr);
        EXPECT_EQ(ToHost(de, n * k), want_e) << ne << " top-" << k;
        EXPECT_LE(RelL2(ToHost(dw, n * k), want_w), 1e-5) << ne << " top-" << k;
        for (void* p : {(void*)dl, (void*)de, (void*)dw}) CUDA_CHECK(cudaFree(p));
      }
    }
  }
}

// Preselected routes without weights: the given experts' probabilities, renormalised, are the
// CPU's (CpuEngine::MoE: cpu::Softmax, then the sum in double in the given order, clamped, each
// divided) bit for bit, the ids left as given; given LaunchRouterTopK's own choices, its weights.
// Where n_expert is not a multiple of 16, the softmax's tail takes GlibcExpf, which may round an
// exp within ~0.002 ulp of a midpoint the other way than glibc's (ggml_math.cuh): within 1e-6 there.
TEST(CudaKernels, RouteWeightsMatchCpu) {
  for (int ne : {8, 16, 40, 128}) {  // 8 and 40: a softmax tail past the last whole group of 16
    for (int k : {1, 2, 8}) {
      for (bool norm : {true, false}) {
        const int n = 9;
        std::vector<float> logits = Random(n * ne, 2.0f);
        std::vector<int32_t> ids(n * k);
        for (int t = 0; t < n; ++t) {
          std::vector<int32_t> order(ne);
          for (int e = 0; e < ne; ++e) order[e] = e;
          std::shuffle(order.begin(), order.end(), rng);
          std::copy(order.begin(), order.begin() + k, ids.begin() + t * k);
        }
        std::vector<float> want(n * k);
        for (int t = 0; t < n; ++t) {
          std::vector<float> p(logits.begin() + t * ne, logits.begin() + (t + 1) * ne);
          cpu::Softmax(p.data(), ne, 1.0f);
          double sum = 0.0;
          for (int j = 0; j < k; ++j) sum += want[t * k + j] = p[ids[t * k + j]];
          const float div = std::max(static_cast<float>(sum), 6.103515625e-5f);
          for (int j = 0; norm && j < k; ++j) want[t * k + j] /= div;
        }
        const std::string what =
            "n_expert " + std::to_string(ne) + " top-" + std::to_string(k) + " norm " + std::to_string(norm);
        float* dl = ToDevice(logits);
        int32_t* de = ToDevice(ids);
        float* dw = DeviceNaN<float>(n * k);
        cuda::LaunchRouteWeights(dl, n, ne, k, norm, de, dw, nullptr);
        EXPECT_EQ(ToHost(de, n * k), ids) << what;
        const std::vector<float> got = ToHost(dw, n * k);
        if (ne % 16 == 0) {
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
              << what << ": rel L2 " << RelL2(got, want);
        } else {
          EXPECT_LE(RelL2(got, want), 1e-6) << what;
        }
        // The router's own choices give the router's weights.
        float* rw = DeviceNaN<float>(n * k);
        cuda::LaunchRouterTopK(dl, n, ne, k, norm, de, rw, nullptr, nullptr, nullptr);
        const std::vector<float> router_w = ToHost(rw, n * k);
        cuda::LaunchRouteWeights(dl, n, ne, k, norm, de, dw, nullptr);
        const std::vector<float> given_w = ToHost(dw, n * k);
        EXPECT_EQ(std::memcmp(given_w.data(), router_w.data(), router_w.size() * sizeof(float)), 0) << what;
        for (void* p : {(void*)dl, (void*)de, (void*)dw, (void*)rw}) CUDA_CHECK(cudaFree(p));
      }
    }
  }
}

// The decode step's fused routing (router mat-vec + top-k + groups in one launch) gives exactly
// what the f32 mat-vec followed by LaunchRouterTopK gives, over several launches (its block
// counter must reset itself); with the MoE norm fused in (Router1Norm), also the activations
// and the logits that LaunchRmsNorm followed by the mat-vec gives.
TEST(CudaKernels, FusedRouterEqualsMatvecThenTopK) {
  for (int64_t cols : {64, 768, 2048, 4096})
    for (bool fused_norm : {false, true}) {
      for (int ne : {8, 128}) {
        const int k = ne == 8 ? 2 : 8;
        const std::vector<float> w = Random(ne * cols, 0.05f);
        float* dw = ToDevice(w);
        std::vector<int32_t> slots(ne, 0);
        slots[1] = -1;
        int32_t* ds = ToDevice(slots);
        int32_t* buf = DeviceNaN<int32_t>(2 + ne + ne + 1 + k);
        unsigned long long* lookups = nullptr;
        unsigned int* done = nullptr;
        CUDA_CHECK(cudaMalloc(&lookups, 8));
        CUDA_CHECK(cudaMemset(lookups, 0, 8));
        CUDA_CHECK(cudaMalloc(&done, 4));
        CUDA_CHECK(cudaMemset(done, 0, 4));
        const cuda::MoeGroups g{buf, buf + 1, buf + 2, buf + 2 + ne, buf + 2 + ne + ne + 1, lookups};
        for (int rep = 0; rep < 3; ++rep) {
          const std::vector<float> x = Random(cols, fused_norm ? 3.0f : 1.0f), nw = Random(cols);
          float* dx = ToDevice(x);
          float* dnw = ToDevice(nw);
          float* xn = DeviceNaN<float>(cols);
          DeviceAct want_act(GgmlType::kQ8_0, cols, 1), got_act(GgmlType::kQ8_0, cols, 1);
          if (fused_norm)
            cuda::LaunchRmsNorm(dx, cols, nullptr, 1, cuda::MoeCombine{}, dnw, 1e-6f, cols, xn, cols, want_act.act,
                                nullptr);
          float* logits = DeviceNaN<float>(ne);
          int32_t* want_e = DeviceNaN<int32_t>(k);
          float* want_w = DeviceNaN<float>(k);
          const cuda::DevMatrix m{cuda::kDevF32, ne, cols, reinterpret_cast<const uint8_t*>(dw)};
          const cuda::MatvecOutput out{m, logits, ne, nullptr};
          const cuda::DevAct act{cuda::kDevF32, cols, reinterpret_cast<uint8_t*>(fused_norm ? xn : dx), nullptr};
          cuda::LaunchMatvec(&out, 1, act, 1, nullptr);
          cuda::LaunchRouterTopK(logits, 1, ne, k, true, want_e, want_w, nullptr, nullptr, nullptr);
          ASSERT_TRUE(cuda::RouterTopK1Supported(cols, ne));
          cuda::Router1Args a{};
          a.router = dw;
          a.x = dx;
          a.n_embd = static_cast<int32_t>(cols);
          a.n_expert = ne;
          a.k = k;
          a.norm_topk = true;
          a.logits = DeviceNaN<float>(ne);
          a.blocks_done = done;
          a.chosen = DeviceNaN<int32_t>(k);
          a.weights = DeviceNaN<float>(k);
          a.slot_table = ds;
          a.groups = g;
          if (fused_norm) a.norm = cuda::Router1Norm{dx, dnw, 1e-6f, got_act.act};
          cuda::LaunchRouterTopK1(a, nullptr);
          EXPECT_EQ(ToHost(a.logits, ne), ToHost(logits, ne)) << cols << "x" << ne << (fused_norm ? " norm" : "");
          if (fused_norm) {
            EXPECT_EQ(ToHost(got_act.act.data, cols), ToHost(want_act.act.data, cols)) << cols << " norm's quants";
            EXPECT_EQ(ToHost(got_act.act.scales, cols / 32), ToHost(want_act.act.scales, cols / 32)) << cols;
          }
          const std::vector<int32_t> e = ToHost(a.chosen, k);
          EXPECT_EQ(e, ToHost(want_e, k)) << cols << "x" << ne;
          EXPECT_EQ(ToHost(a.weights, k), ToHost(want_w, k)) << cols << "x" << ne;
          // The groups of a single token: its experts ascending, one pair each.
          const std::vector<int32_t> h = ToHost(buf, 2 + ne + ne + 1 + k);
          std::vector<int32_t> sorted(e);
          std::sort(sorted.begin(), sorted.end());
          ASSERT_EQ(h[0], k);
          int missing = 0;
          for (int u = 0; u < k; ++u) {
            EXPECT_EQ(h[2 + u], sorted[u]);
            EXPECT_EQ(e[h[2 + ne + ne + 1 + u]], sorted[u]);
            missing += sorted[u] == 1;
          }
          EXPECT_EQ(h[1], missing);
          EXPECT_EQ(ToHost(done, 1)[0], 0u);
          for (void* p : {(void*)dx, (void*)dnw, (void*)xn, (void*)logits, (void*)want_e, (void*)want_w,
                          (void*)a.logits, (void*)a.chosen, (void*)a.weights})
            CUDA_CHECK(cudaFree(p));
        }
        EXPECT_EQ(ToHost(lookups, 1)[0], 3ull * k);
        for (void* p : {(void*)dw, (void*)ds, (void*)buf, (void*)lookups, (void*)done}) CUDA_CHECK(cudaFree(p));
      }
    }
}

// The argmax kernel against Sampler::Argmax: distinct values, ties (the lowest index), NaNs (never
// chosen; one at index 0 kept), rows of -inf, +inf twice, lengths around the block size up to the
// 30B vocabulary.
TEST(CudaKernels, ArgmaxRowsEqualsSamplerArgmax) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {1, 7, 1024, 1025, 4099, 151936}) {
    std::vector<std::vector<float>> rows;
    rows.push_back(Random(n));
    std::vector<float> tie = Random(n);
    tie[n - 1] = tie[n / 2] = 9.0f;
    rows.push_back(tie);
    rows.push_back(std::vector<float>(n, -inf));
    std::vector<float> nan0 = Random(n);
    nan0[0] = nan;
    rows.push_back(nan0);
    std::vector<float> nans = Random(n);
    for (int64_t i = 1; i < n; i += 5) nans[i] = nan;
    rows.push_back(nans);
    std::vector<float> infs = Random(n);
    infs[n - 1] = inf;
    infs[(n - 1) / 3] = inf;
    rows.push_back(infs);
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    float* d = ToDevice(flat);
    int32_t* ids = DeviceNaN<int32_t>(rows.size());
    void* scratch = nullptr;
    const int64_t scratch_bytes = cuda::ArgmaxScratchBytes(static_cast<int>(rows.size()));
    CUDA_CHECK(cudaMalloc(&scratch, scratch_bytes));
    CUDA_CHECK(cudaMemset(scratch, 0, scratch_bytes));
    // Every row, then again on the tickets that left, then the first row alone and every row again
    // (the scratch's layout must not depend on the launch's rows).
    const int all = static_cast<int>(rows.size());
    for (int launch_rows : {all, all, 1, all}) {
      CUDA_CHECK(cudaMemset(ids, 0xff, all * sizeof(int32_t)));
      cuda::LaunchArgmaxRows(d, launch_rows, n, ids, scratch, all, nullptr);
      const std::vector<int32_t> got = ToHost(ids, launch_rows);
      for (int r = 0; r < launch_rows; ++r)
        EXPECT_EQ(got[r], Sampler::Argmax(rows[r])) << "n " << n << " row " << r << " of " << launch_rows;
    }
    for (void* p : {(void*)d, (void*)ids, scratch}) CUDA_CHECK(cudaFree(p));
  }
}

TEST(CudaKernels, MoeGroupPartitionsPairs) {
  const int ne = 32, n_pairs = 50;
  std::vector<int32_t> chosen(n_pairs);
  for (int i = 0; i < n_pairs; ++i) chosen[i] = (i * 7 + i / 3) % 13 * 2;
  std::vector<int32_t> slots(ne, 0);
  slots[4] = -1;
  slots[6] = -1;
  int32_t* dc = ToDevice(chosen);
  int32_t* ds = ToDevice(slots);
  int32_t* buf = DeviceNaN<int32_t>(2 + ne + ne + 1 + n_pairs);
  unsigned long long* lookups = nullptr;
  CUDA_CHECK(cudaMalloc(&lookups, 8));
  CUDA_CHECK(cudaMemset(lookups, 0, 8));
  const cuda::MoeGroups g{buf, buf + 1, buf + 2, buf + 2 + ne, buf + 2 + ne + ne + 1, lookups};
  cuda::LaunchMoeGroup(dc, n_pairs, ne, ds, g, nullptr);
  const std::vector<int32_t> h = ToHost(buf, 2 + ne + ne + 1 + n_pairs);
  const int n_used = h[0];
  // The used experts in order of decreasing pair count, ties by id (moe_group.cu).
  std::vector<int32_t> distinct(chosen);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  const auto pairs_of = [&](int32_t e) { return std::count(chosen.begin(), chosen.end(), e); };
  std::stable_sort(distinct.begin(), distinct.end(), [&](int32_t a, int32_t b) { return pairs_of(a) > pairs_of(b); });
  ASSERT_EQ(n_used, static_cast<int>(distinct.size()));
  EXPECT_EQ(h[1],
            int(std::count(distinct.begin(), distinct.end(), 4) + std::count(distinct.begin(), distinct.end(), 6)));
  std::vector<int> seen(n_pairs, 0);
  for (int u = 0; u < n_used; ++u) {
    EXPECT_EQ(h[2 + u], distinct[u]);
    for (int i = h[2 + ne + u]; i < h[2 + ne + u + 1]; ++i) {
      const int pair = h[2 + ne + ne + 1 + i];
      EXPECT_EQ(chosen[pair], distinct[u]);
      ++seen[pair];
    }
  }
  for (int i = 0; i < n_pairs; ++i) EXPECT_EQ(seen[i], 1) << i;
  EXPECT_EQ(ToHost(lookups, 1)[0], static_cast<unsigned long long>(n_used));
  for (void* p : {(void*)dc, (void*)ds, (void*)buf, (void*)lookups}) CUDA_CHECK(cudaFree(p));
}

// Q/K norm + RoPE + KV append, then attention over the cache, for GQA head layouts and
// positions across sequences, against cpu_ops.h.
struct AttentionShape {
  int n_head, n_head_kv, head_dim;
};

// Q/K norm + RoPE and attention of a batch (token t of sequence seq[t] at position pos[t]) against
// a double-precision reference: the exact kernel after LaunchQkNormRope, the split-K path, or the
// exact kernel doing the norm and RoPE itself (fused_rope: each token of its own sequence).
enum class AttentionPath { kExact, kSplit, kFusedRope };

void CheckQkNormRopeAttention(AttentionShape sh, int max_ctx, const std::vector<int32_t>& seq,
                              const std::vector<int32_t>& pos, AttentionPath path) {
  const bool split = path == AttentionPath::kSplit, fused = path == AttentionPath::kFusedRope;
  {
    const int n_seq = 2, HD = sh.head_dim, KD = sh.n_head_kv * HD, QD = sh.n_head * HD, half = HD / 2;
    const int n = seq.size();
    std::vector<float> kc = Random(int64_t(n_seq) * max_ctx * KD), vc = Random(int64_t(n_seq) * max_ctx * KD);
    const std::vector<float> q = Random(n * QD), k = Random(n * KD), v = Random(n * KD);
    const std::vector<float> qn = Random(HD), kn = Random(HD);
    std::vector<float> rc(n * half), rs(n * half);
    for (int t = 0; t < n; ++t) cpu::RopeCache(pos[t], 1e6f, HD, &rc[t * half], &rs[t * half]);
    // CPU reference.
    std::vector<float> q_ref = q, k_ref = k, kc_ref = kc, vc_ref = vc, out_ref(n * QD);
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < sh.n_head; ++h) {
        cpu::RmsNorm(&q_ref[t * QD + h * HD], qn.data(), 1e-6f, HD, &q_ref[t * QD + h * HD]);
        cpu::RopeNeox(&q_ref[t * QD + h * HD], HD, &rc[t * half], &rs[t * half]);
      }
      for (int h = 0; h < sh.n_head_kv; ++h) {
        cpu::RmsNorm(&k_ref[t * KD + h * HD], kn.data(), 1e-6f, HD, &k_ref[t * KD + h * HD]);
        cpu::RopeNeox(&k_ref[t * KD + h * HD], HD, &rc[t * half], &rs[t * half]);
      }
      const int64_t cell = (int64_t(seq[t]) * max_ctx + pos[t]) * KD;
      std::copy(&k_ref[t * KD], &k_ref[t * KD] + KD, &kc_ref[cell]);
      std::copy(&v[t * KD], &v[t * KD] + KD, &vc_ref[cell]);
    }
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < sh.n_head; ++h) {
        const int kvh = h / (sh.n_head / sh.n_head_kv), n_pos = pos[t] + 1;
        std::vector<double> s(n_pos);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < n_pos; ++j) {
          double d = 0;
          for (int i = 0; i < HD; ++i)
            d += double(q_ref[t * QD + h * HD + i]) * kc_ref[(int64_t(seq[t]) * max_ctx + j) * KD + kvh * HD + i];
          s[j] = d / std::sqrt(double(HD));
          mx = std::max(mx, s[j]);
        }
        for (int j = 0; j < n_pos; ++j) sum += s[j] = std::exp(s[j] - mx);
        for (int i = 0; i < HD; ++i) {
          double o = 0;
          for (int j = 0; j < n_pos; ++j) o += s[j] / sum * vc_ref[(int64_t(seq[t]) * max_ctx + j) * KD + kvh * HD + i];
          out_ref[t * QD + h * HD + i] = static_cast<float>(o);
        }
      }
    float *dq = ToDevice(q), *dk = ToDevice(k), *dv = ToDevice(v), *dqn = ToDevice(qn), *dkn = ToDevice(kn);
    float *drc = ToDevice(rc), *drs = ToDevice(rs), *dkc = ToDevice(kc), *dvc = ToDevice(vc);
    int32_t *dseq = ToDevice(seq), *dpos = ToDevice(pos);
    float* scores = DeviceNaN<float>(int64_t(n) * sh.n_head * cuda::AttentionScoresStride(max_ctx));
    float* out = DeviceNaN<float>(n * QD);
    cuda::QkNormRopeArgs r{dq,   dk,  dv,  dqn,       dkn,          drc, drs,     dseq,
                           dpos, dkc, dvc, sh.n_head, sh.n_head_kv, HD,  max_ctx, 1e-6f};
    if (!fused) cuda::LaunchQkNormRope(r, n, nullptr);
    cuda::AttentionArgs a{dq, dkc, dvc, dseq, dpos, scores, out, cuda::DevAct{}, sh.n_head, sh.n_head_kv, HD, max_ctx};
    a.split = split;
    if (split) {
      ASSERT_TRUE(cuda::AttentionSplitSupported(HD, max_ctx)) << "head_dim " << HD;
    }
    if (fused) {
      ASSERT_TRUE(cuda::AttentionFusesQkNormRope(HD)) << "head_dim " << HD;
      a.fused_rope = true;
      a.rope = r;
    }
    cuda::LaunchAttention(a, n, nullptr);
    const std::string what = std::string(split   ? "split-K"
                                         : fused ? "fused Q/K norm + RoPE"
                                                 : "exact") +
                             ", head_dim " + std::to_string(HD) + ", max_ctx " + std::to_string(max_ctx);
    if (!fused) {  // fused: q stays raw
      EXPECT_LE(RelL2(ToHost(dq, n * QD), q_ref), 1e-6) << "q, " << what;
    }
    EXPECT_LE(RelL2(ToHost(dkc, kc.size()), kc_ref), 1e-6) << "k cache, " << what;
    EXPECT_EQ(ToHost(dvc, vc.size()), vc_ref) << "v cache, " << what;
    EXPECT_LE(RelL2(ToHost(out, n * QD), out_ref), 1e-5) << "attention, " << what;
    for (void* p : {(void*)dq, (void*)dk, (void*)dv, (void*)dqn, (void*)dkn, (void*)drc, (void*)drs, (void*)dkc,
                    (void*)dvc, (void*)dseq, (void*)dpos, (void*)scores, (void*)out})
      CUDA_CHECK(cudaFree(p));
  }
}

TEST(CudaKernels, QkNormRopeAndAttentionMatchCpu) {
  // A batch continuing two sequences: seq 0 from position 0 (6 tokens), seq 1 from 250 (3 tokens).
  std::vector<int32_t> seq, pos;
  for (int i = 0; i < 6; ++i) {
    seq.push_back(0);
    pos.push_back(i);
  }
  for (int i = 0; i < 3; ++i) {
    seq.push_back(1);
    pos.push_back(250 + i);
  }
  for (AttentionShape sh : {AttentionShape{4, 2, 16}, AttentionShape{12, 4, 64}, AttentionShape{32, 4, 128}})
    CheckQkNormRopeAttention(sh, 300, seq, pos, AttentionPath::kExact);
}

// Decode steps: the attention kernel doing the Q/K norm, RoPE and KV append itself, one token per
// sequence, at the first cell, within the first 64 cells, at 64 and past it.
TEST(CudaKernels, AttentionWithFusedQkNormRopeMatchesCpu) {
  for (AttentionShape sh : {AttentionShape{4, 2, 16}, AttentionShape{12, 4, 64}, AttentionShape{32, 4, 128}}) {
    CheckQkNormRopeAttention(sh, 300, {0, 1}, {0, 63}, AttentionPath::kFusedRope);
    CheckQkNormRopeAttention(sh, 300, {1, 0}, {64, 250}, AttentionPath::kFusedRope);
  }
}

// Long contexts: the exact kernel and split-K, with splits of every fill (a last split of 1 cell,
// a full one, one token within the first split), for GQA groups of 1 to 20 query heads (a block
// takes up to 16) and head_dim 32 to 256.
TEST(CudaKernels, LongContextAttentionSplitK) {
  const std::vector<int32_t> seq = {0, 0, 1, 1}, pos = {4096, 4351, 100, 2999};
  for (AttentionShape sh : {AttentionShape{12, 4, 64}, AttentionShape{32, 4, 128}, AttentionShape{64, 4, 128},
                            AttentionShape{20, 1, 64}, AttentionShape{8, 8, 32}, AttentionShape{16, 2, 256}})
    for (AttentionPath path : {AttentionPath::kExact, AttentionPath::kSplit})
      CheckQkNormRopeAttention(sh, 4400, seq, pos, path);
}

// Split-K at short contexts, where the cells are cut into splits of 32 or more: one cell, one
// split, a split and a cell, and several partial ones, in two sequences at once.
TEST(CudaKernels, ShortContextAttentionSplitK) {
  const std::vector<int32_t> seq = {0, 1, 0, 1, 0, 1}, pos = {0, 31, 32, 200, 700, 1023};
  for (AttentionShape sh : {AttentionShape{32, 4, 128}, AttentionShape{12, 4, 64}})
    CheckQkNormRopeAttention(sh, 1100, seq, pos, AttentionPath::kSplit);
}

// The tensor-core attention (flash_attention.cuh) against the exact kernel on the same random q
// and cache (cells of 2 sequences of max_ctx; the batch's cells already in the cache): relative
// L2 within kFlashAttentionRelL2Bound over the whole output, every row finite and within 4x the
// bound on its own. With poison, the cells no row may read (past each sequence's last position
// in the batch, and the whole of a sequence the batch does not touch) hold K = 1e4 and V = NaN,
// and the cell of the batch's last position, which only its own row reads, V = 1e3: a kernel
// reading past a row's position, past the step's cells or across sequences fails.
void CheckFlashAttention(AttentionShape sh, int max_ctx, const std::vector<int32_t>& seq,
                         const std::vector<int32_t>& pos, bool poison) {
  const int n_seq = 2, HD = sh.head_dim, KD = sh.n_head_kv * HD, QD = sh.n_head * HD, n = seq.size();
  std::vector<float> kc = Random(int64_t(n_seq) * max_ctx * KD), vc = Random(int64_t(n_seq) * max_ctx * KD);
  const std::vector<float> q = Random(int64_t(n) * QD);
  if (poison) {
    std::vector<int32_t> last(n_seq, -1);
    for (int t = 0; t < n; ++t) last[seq[t]] = std::max(last[seq[t]], pos[t]);
    for (int s = 0; s < n_seq; ++s)
      for (int c = last[s] + 1; c < max_ctx; ++c)
        for (int i = 0; i < KD; ++i) {
          kc[(int64_t(s) * max_ctx + c) * KD + i] = 1e4f;
          vc[(int64_t(s) * max_ctx + c) * KD + i] = std::numeric_limits<float>::quiet_NaN();
        }
    for (int i = 0; i < KD; ++i) vc[(int64_t(seq[n - 1]) * max_ctx + pos[n - 1]) * KD + i] = 1e3f;
  }
  float *dq = ToDevice(q), *dkc = ToDevice(kc), *dvc = ToDevice(vc);
  int32_t *dseq = ToDevice(seq), *dpos = ToDevice(pos);
  float* scores = DeviceNaN<float>(int64_t(n) * sh.n_head * cuda::AttentionScoresStride(max_ctx));
  float *want_d = DeviceNaN<float>(int64_t(n) * QD), *got_d = DeviceNaN<float>(int64_t(n) * QD);
  cuda::AttentionArgs a{dq, dkc, dvc, dseq, dpos, scores, want_d, cuda::DevAct{}, sh.n_head, sh.n_head_kv, HD, max_ctx};
  cuda::LaunchAttention(a, n, nullptr);
  a.out = got_d;
  a.scores = nullptr;
  ASSERT_TRUE(cuda::FlashAttentionSupported(HD)) << "head_dim " << HD;
  cuda::LaunchFlashAttention(a, n, nullptr);
  const std::vector<float> want = ToHost(want_d, int64_t(n) * QD), got = ToHost(got_d, int64_t(n) * QD);
  const std::string what = "flash attention, heads " + std::to_string(sh.n_head) + "/" + std::to_string(sh.n_head_kv) +
                           " x " + std::to_string(HD) + ", " + std::to_string(n) + " tokens" +
                           (poison ? ", poisoned cells" : "");
  const double err = RelL2(got, want);
  EXPECT_LE(err, cuda::kFlashAttentionRelL2Bound) << what;
  double worst_row = 0;
  for (int t = 0; t < n; ++t) {
    const std::vector<float> g(got.begin() + int64_t(t) * QD, got.begin() + int64_t(t + 1) * QD);
    const std::vector<float> w(want.begin() + int64_t(t) * QD, want.begin() + int64_t(t + 1) * QD);
    const double e = RelL2(g, w);  // infinite for a non-finite row
    worst_row = std::max(worst_row, e);
    ASSERT_LE(e, 4 * cuda::kFlashAttentionRelL2Bound)
        << what << ": token " << t << " (seq " << seq[t] << ", pos " << pos[t] << ")";
  }
  std::printf("[%s] rel L2 %.3g, worst row %.3g\n", what.c_str(), err, worst_row);
  for (void* p :
       {(void*)dq, (void*)dkc, (void*)dvc, (void*)dseq, (void*)dpos, (void*)scores, (void*)want_d, (void*)got_d})
    CUDA_CHECK(cudaFree(p));
}

// n consecutive positions of one sequence from `first` (a prompt chunk).
void Chunk(int32_t s, int32_t first, int n, std::vector<int32_t>* seq, std::vector<int32_t>* pos) {
  for (int i = 0; i < n; ++i) {
    seq->push_back(s);
    pos->push_back(first + i);
  }
}

// Prompt chunks from position 0 (1 to 512 tokens: one tile, tiles partly filled, several tiles)
// and one continuing a sequence (positions 300..811, the earlier cells already in the cache), at
// head_dim 64 and 128 with GQA ratios 1, 4 and 8.
TEST(CudaKernels, FlashAttentionCloseToExact) {
  for (AttentionShape sh : {AttentionShape{8, 8, 64}, AttentionShape{16, 4, 64}, AttentionShape{8, 1, 64},
                            AttentionShape{8, 8, 128}, AttentionShape{32, 8, 128}, AttentionShape{32, 4, 128}}) {
    for (int n : {1, 17, 64, 200, 512}) {
      std::vector<int32_t> seq, pos;
      Chunk(0, 0, n, &seq, &pos);
      CheckFlashAttention(sh, 1024, seq, pos, false);
    }
    std::vector<int32_t> seq, pos;
    Chunk(1, 300, 512, &seq, &pos);
    CheckFlashAttention(sh, 1024, seq, pos, false);
  }
}

// Batches that are not one run: two sequences' chunks in one step (a tile holding both), and
// single tokens of either sequence at scattered positions between and after them.
TEST(CudaKernels, FlashAttentionMixedBatchCloseToExact) {
  for (AttentionShape sh : {AttentionShape{16, 4, 64}, AttentionShape{32, 4, 128}}) {
    std::vector<int32_t> seq, pos;
    Chunk(1, 500, 70, &seq, &pos);
    Chunk(0, 0, 60, &seq, &pos);
    for (int32_t p : {700, 3, 999}) Chunk(0, p, 1, &seq, &pos);
    Chunk(1, 640, 1, &seq, &pos);
    CheckFlashAttention(sh, 1024, seq, pos, false);
  }
}

// Masking: the cells a row may not read hold values that would show (module comment of
// CheckFlashAttention), and the 1e3 of the last position's V reaches only its own row.
TEST(CudaKernels, FlashAttentionMasksFutureAndOtherCells) {
  for (AttentionShape sh : {AttentionShape{8, 2, 64}, AttentionShape{32, 4, 128}}) {
    std::vector<int32_t> seq, pos;
    Chunk(0, 0, 100, &seq, &pos);
    CheckFlashAttention(sh, 512, seq, pos, true);
    seq.clear();
    pos.clear();
    Chunk(1, 300, 150, &seq, &pos);  // sequence 0 untouched: all of it poisoned
    CheckFlashAttention(sh, 512, seq, pos, true);
  }
}

// With out_act the output goes out as activations: for Q8_0 (a warp per 32-element block) the
// bytes of the f32 output converted by LaunchQuantize.
TEST(CudaKernels, FlashAttentionWritesActivations) {
  const AttentionShape sh{32, 4, 128};
  const int max_ctx = 256, HD = sh.head_dim, KD = sh.n_head_kv * HD, QD = sh.n_head * HD;
  std::vector<int32_t> seq, pos;
  Chunk(0, 10, 100, &seq, &pos);
  const int n = seq.size();
  float *dq = ToDevice(Random(int64_t(n) * QD)), *dkc = ToDevice(Random(int64_t(max_ctx) * KD)),
        *dvc = ToDevice(Random(int64_t(max_ctx) * KD));
  int32_t *dseq = ToDevice(seq), *dpos = ToDevice(pos);
  float* out = DeviceNaN<float>(int64_t(n) * QD);
  cuda::AttentionArgs a{dq, dkc, dvc, dseq, dpos, nullptr, out, cuda::DevAct{}, sh.n_head, sh.n_head_kv, HD, max_ctx};
  cuda::LaunchFlashAttention(a, n, nullptr);
  DeviceAct want(GgmlType::kQ8_0, QD, n), got(GgmlType::kQ8_0, QD, n);
  cuda::LaunchQuantize(out, QD, n, QD, want.act, nullptr);
  a.out = nullptr;
  a.out_act = got.act;
  cuda::LaunchFlashAttention(a, n, nullptr);
  const int64_t rb = cuda::ActRowBytes(want.act.type, QD);
  EXPECT_EQ(ToHost(got.act.data, n * rb), ToHost(want.act.data, n * rb));
  EXPECT_EQ(ToHost(got.act.scales, n * QD / 32), ToHost(want.act.scales, n * QD / 32));
  for (void* p : {(void*)dq, (void*)dkc, (void*)dvc, (void*)dseq, (void*)dpos, (void*)out}) CUDA_CHECK(cudaFree(p));
}

// ---------------------------------------------------------------------------------------------
// K-quants and the IQ types of 256-element blocks: Q2_K to Q6_K, IQ4_XS, IQ2_XXS, IQ2_XS, IQ2_S,
// IQ3_XXS, IQ3_S and IQ1_S weights with Q8_K activations (kquant_layout.cuh, kquant_dot.cuh).

const GgmlType kKQuantTypes[] = {GgmlType::kQ2_K,  GgmlType::kQ3_K,    GgmlType::kQ4_K,    GgmlType::kQ5_K,
                                 GgmlType::kQ6_K,  GgmlType::kIQ4_XS,  GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS,
                                 GgmlType::kIQ2_S, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,   GgmlType::kIQ1_S};

// "" when got equals want element for element; else how many differ, where the first one is
// ([token][row], `rows` per token) and the two values.
// rows x cols weights of one of kKQuantTypes: quantized from Gaussian floats, or (raw) random bytes
// with small f16 scales, which reach every 6-bit scale/min pattern and every int8 scale (-128 too),
// every IQ4 code and scale, every grid point, sign pattern and scale of the IQ types.
std::vector<uint8_t> KQuantWeights(GgmlType type, int64_t rows, int64_t cols, bool raw) {
  const int64_t rb = RowBytes(type, cols);
  std::vector<uint8_t> w(rows * rb);
  if (!raw) {
    const std::vector<float> f = Random(rows * cols, 0.05f);
    for (int64_t r = 0; r < rows; ++r) QuantizeRow(type, &f[r * cols], &w[r * rb], cols);
    return w;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : w) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  const bool has_dmin = type == GgmlType::kQ4_K || type == GgmlType::kQ5_K;
  const int64_t block = RowBytes(type, 256);
  for (size_t b = 0; b < w.size() / block; ++b) {
    const f16_bits d = F32ToF16(scale(rng)), dmin = F32ToF16(scale(rng));
    // d first but in Q6_K, Q3_K and Q2_K (d, dmin last)
    const int d_at = type == GgmlType::kQ6_K ? 208 : type == GgmlType::kQ3_K ? 108 : type == GgmlType::kQ2_K ? 80 : 0;
    std::memcpy(&w[b * block + d_at], &d, 2);
    if (has_dmin) std::memcpy(&w[b * block + 2], &dmin, 2);
    if (type == GgmlType::kQ2_K) std::memcpy(&w[b * block + 82], &dmin, 2);
  }
  return w;
}

// Q8_K conversion of rows of f32 (an all-zero block, ties of magnitude of either sign first
// included) against QuantizeRowQ8_K: quants, bsums and d.
TEST(CudaKernels, QuantizeQ8_KIsBitExact) {
  for (int64_t cols : {256, 512, 768, 2048, 4096}) {
    for (int n : {1, 3, 17}) {
      std::vector<float> x = Random(n * cols, 3.0f);
      std::fill(x.begin(), x.begin() + 256, 0.0f);  // row 0, block 0
      if (n > 1) {
        x[cols + 5] = 60.0f;  // row 1: a tie, the first wins
        x[cols + 9] = -60.0f;
      }
      if (n > 2) {
        x[2 * cols + 3] = -70.0f;
        x[2 * cols + 8] = 70.0f;
      }
      float* dx = ToDevice(x);
      DeviceAct a(GgmlType::kQ8_K, cols, n);
      cuda::LaunchQuantize(dx, cols, n, cols, a.act, nullptr);
      const int64_t rb = cuda::Q8_KRowBytes(cols), nb = cols / 256;
      const std::vector<uint8_t> got = ToHost(a.act.data, n * rb);
      const std::vector<float> got_d = ToHost(a.act.scales, n * nb);
      for (int t = 0; t < n; ++t) {
        std::vector<BlockQ8_K> want(nb);
        QuantizeRowQ8_K(&x[t * cols], want.data(), cols);
        for (int64_t b = 0; b < nb; ++b) {
          for (int e = 0; e < 256; ++e)
            ASSERT_EQ(want[b].qs[e], static_cast<int8_t>(got[t * rb + cuda::Q8_KQuantOffset(b * 256 + e)]))
                << "q8_k cols " << cols << " row " << t << " block " << b << " element " << e;
          int16_t bsums[16];
          std::memcpy(bsums, &got[t * rb + cuda::Q8_KBsumsOffset(cols, b)], 32);
          for (int j = 0; j < 16; ++j)
            ASSERT_EQ(want[b].bsums[j], bsums[j])
                << "q8_k cols " << cols << " row " << t << " block " << b << " bsum " << j;
          ASSERT_EQ(want[b].d, got_d[t * nb + b]) << "q8_k cols " << cols << " row " << t << " block " << b << " d";
        }
      }
      CUDA_CHECK(cudaFree(dx));
    }
  }
}

// One launch of matrix 0 alone, then one of matrix 0 again with a residual and two shorter ones
// (the concatenated rows of Q/K/V), n tokens, against the CPU's row dots: equal, or within
// tolerance of the largest output.
void KQuantMatvecMatchesCpuFor(GgmlType type, int64_t rows, int64_t cols, int n, double tolerance = 0) {
  const bool raw = (rows + n) % 2 == 1;
  const int64_t nb = cols / 256;
  const int64_t heights[4] = {rows, rows, rows / 2 + 1, 3};
  const bool raws[4] = {raw, raw, !raw, raw};
  std::vector<std::vector<uint8_t>> w(4);
  w[0] = KQuantWeights(type, rows, cols, raw);
  w[1] = w[0];
  w[2] = KQuantWeights(type, heights[2], cols, raws[2]);
  w[3] = KQuantWeights(type, heights[3], cols, raws[3]);
  const std::vector<float> x = Random(n * cols);
  const std::vector<float> res = Random(n * rows);
  std::vector<std::vector<float>> want(4);
  std::vector<BlockQ8_K> act(nb);
  for (int i = 0; i < 4; ++i) want[i].resize(n * heights[i]);
  for (int t = 0; t < n; ++t) {
    QuantizeRowQ8_K(&x[t * cols], act.data(), cols);
    for (int i = 0; i < 4; ++i) VecDotRows(type, w[i].data(), heights[i], act.data(), cols, &want[i][t * heights[i]]);
    for (int64_t r = 0; r < rows; ++r) want[1][t * rows + r] = res[t * rows + r] + want[1][t * rows + r];
  }
  float* dx = ToDevice(x);
  DeviceAct a(GgmlType::kQ8_K, cols, n);
  cuda::LaunchQuantize(dx, cols, n, cols, a.act, nullptr);
  uint8_t* raw_w[4];
  uint8_t* dw[4];
  float* out[4];
  cuda::MatvecOutput outs[4];
  for (int i = 0; i < 4; ++i) {
    raw_w[i] = ToDevice(w[i]);
    dw[i] = DeviceNaN<uint8_t>(w[i].size());
    const cuda::RepackJob job{raw_w[i], dw[i], int64_t(w[i].size()), cols};
    cuda::LaunchRepack(static_cast<int>(type), &job, 1, nullptr);
    out[i] = i == 1 ? ToDevice(res) : DeviceNaN<float>(n * heights[i]);
    outs[i] = {cuda::DevMatrix{static_cast<int>(type), heights[i], cols, dw[i]}, out[i], heights[i],
               i == 1 ? out[1] : nullptr};
  }
  cuda::LaunchMatvec(outs, 1, a.act, n, nullptr);
  cuda::LaunchMatvec(outs + 1, 3, a.act, n, nullptr);
  const char* what[4] = {"alone", "first of three, with a residual", "second of three", "third of three"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(Mismatch(ToHost(out[i], n * heights[i]), want[i], heights[i], tolerance), "")
        << TypeName(type) << (raws[i] ? " random-byte" : " quantized") << " weights " << heights[i] << "x" << cols
        << ", " << n << " tokens (" << what[i] << ")";
  }
  for (int i = 0; i < 4; ++i)
    for (void* p : {(void*)raw_w[i], (void*)dw[i], (void*)out[i]}) CUDA_CHECK(cudaFree(p));
  CUDA_CHECK(cudaFree(dx));
}

// Dense mat-vec of kKQuantTypes rows: cols 256..4096, rows 1..1000, 1..17 tokens, with and
// without a residual, three matrices of different heights in one launch (as Q, K, V), against
// VecDotRows on the CPU-converted activations.
TEST(CudaKernels, KQuantMatvecMatchesCpuRowDots) {
  struct Size {
    int64_t rows, cols;
  };
  for (GgmlType type : kKQuantTypes)
    for (Size sz : {Size{1, 256}, Size{7, 512}, Size{33, 768}, Size{256, 1024}, Size{100, 2048}, Size{1000, 4096},
                    Size{1000, 256}, Size{3, 4096}})
      for (int n : {1, 2, 9, 17}) KQuantMatvecMatchesCpuFor(type, sz.rows, sz.cols, n);
}

// The grouped expert kernels with quantized gate/up and a down of the same or another type (the
// K_M recipes' mixes, IQ types beside K-quants and 32-element types, Q4_0 to Q5_1 throughout), and
// Q8_0 throughout, also at the Qwen3-30B-A3B expert geometry (2,048 x 768, where the decode down
// kernel loads its rows before its wait), experts at permuted arena slots laid out as CudaEngine
// does, against the CPU engine's MoE: row dots, SwiGLU (cpu_ops.h), conversion of h, down row dots. One token also
// goes through the decode path's down kernel, which converts h itself. Gate and up of different
// types go through LaunchExpertGateUpMixed, each with the activations of its own type.
struct ExpertMix {
  GgmlType gate, down;
  int64_t E, F;  // n_embd, n_ff
  // Up's type; gate's where not given.
  std::optional<GgmlType> up = std::nullopt;
  GgmlType up_type() const { return up.value_or(gate); }
};

// Row dots as the CPU engine's MoE takes them: F32 rows in ggml_vec_dot_f32's order
// (cpu::DotF32Ggml, which the GPU keeps), every other type through VecDotRows.
void EngineRowDots(GgmlType type, const uint8_t* rows, int64_t n_rows, const uint8_t* act, int64_t cols, float* out) {
  if (type != GgmlType::kF32) {
    VecDotRows(type, rows, n_rows, act, cols, out);
    return;
  }
  const float* w = reinterpret_cast<const float*>(rows);
  for (int64_t r = 0; r < n_rows; ++r)
    out[r] = cpu::DotF32Ggml(w + r * cols, reinterpret_cast<const float*>(act), cols);
}

// One layer's gate/up and down over 6 experts, top-2 of n tokens, against the CPU engine's MoE:
// h and the down output bit for bit.
// tolerance: 0 for the CPU's bits; else the bound of Mismatch for the gate/up outputs and 1,000
// times it for down's (whose input h, quantized to Q8_0 again, may round differently from the CPU's).
// The GPU's outputs of one ExpertsMatchCpuFor case: SwiGLU h [pairs, n_ff] and down [pairs, n_embd].
struct ExpertOutputs {
  std::vector<float> h, out;
};

ExpertOutputs ExpertsMatchCpuFor(const ExpertMix& mix, int n, double tolerance = 0) {
  const int NE = 6, K = 2;
  auto align = [](int64_t b) { return (b + 255) / 256 * 256; };
  auto weights = [](GgmlType type, int64_t rows, int64_t cols, bool raw) {
    if (ActivationTypeFor(type) == GgmlType::kQ8_K) return KQuantWeights(type, rows, cols, raw);
    const std::vector<float> f = Random(rows * cols, 0.05f);
    std::vector<uint8_t> q(rows * RowBytes(type, cols));
    for (int64_t r = 0; r < rows; ++r) QuantizeRow(type, &f[r * cols], &q[r * RowBytes(type, cols)], cols);
    return q;
  };
  const int64_t E = mix.E, F = mix.F;
  const GgmlType up_type = mix.up_type();
  const int64_t gate_bytes = F * RowBytes(mix.gate, E), up_bytes = F * RowBytes(up_type, E);
  const int64_t down_bytes = E * RowBytes(mix.down, F);
  const int64_t up_offset = align(gate_bytes), down_offset = up_offset + align(up_bytes);
  const int64_t slot_bytes = align(down_offset + down_bytes);
  std::vector<std::vector<uint8_t>> gate(NE), up(NE), down(NE);
  for (int e = 0; e < NE; ++e) {
    gate[e] = weights(mix.gate, F, E, e % 2 == 1);
    up[e] = weights(up_type, F, E, e % 3 == 1);
    down[e] = weights(mix.down, E, F, e % 2 == 0);
  }
  // Expert e in slot NE - 1 - e, each matrix repacked in place as CudaEngine::UploadExpert does.
  uint8_t* arena = DeviceNaN<uint8_t>(NE * slot_bytes);
  std::vector<void*> sources;
  for (int e = 0; e < NE; ++e) {
    uint8_t* slot = arena + (NE - 1 - e) * slot_bytes;
    const std::vector<uint8_t>* parts[3] = {&gate[e], &up[e], &down[e]};
    const int64_t offsets[3] = {0, up_offset, down_offset}, cols[3] = {E, E, F};
    const GgmlType types[3] = {mix.gate, up_type, mix.down};
    for (int i = 0; i < 3; ++i) {
      uint8_t* src = ToDevice(*parts[i]);
      sources.push_back(src);
      const cuda::RepackJob job{src, slot + offsets[i], int64_t(parts[i]->size()), cols[i]};
      cuda::LaunchRepack(static_cast<int>(types[i]), &job, 1, nullptr);
    }
  }
  std::vector<int32_t> slots(NE);
  for (int e = 0; e < NE; ++e) slots[e] = NE - 1 - e;
  // Top-2 of each token: distinct experts, several tokens per expert.
  std::vector<int32_t> chosen(n * K);
  for (int t = 0; t < n; ++t) {
    chosen[t * K] = (3 * t) % NE;
    chosen[t * K + 1] = (3 * t + 1 + t % 2) % NE;
  }
  const int n_pairs = n * K;
  int32_t* d_slots = ToDevice(slots);
  int32_t* d_chosen = ToDevice(chosen);
  int32_t* buf = DeviceNaN<int32_t>(2 + NE + NE + 1 + n_pairs);
  unsigned long long* lookups = nullptr;
  CUDA_CHECK(cudaMalloc(&lookups, 8));
  CUDA_CHECK(cudaMemset(lookups, 0, 8));
  const cuda::MoeGroups groups{buf, buf + 1, buf + 2, buf + 2 + NE, buf + 2 + NE + NE + 1, lookups};
  cuda::LaunchMoeGroup(d_chosen, n_pairs, NE, d_slots, groups, nullptr);

  // CPU reference (CpuEngine::MoE for one layer).
  const std::vector<float> x = Random(n * E);
  const GgmlType down_act = ActivationTypeFor(mix.down);
  std::vector<float> h_want(n_pairs * F), out_want(n_pairs * E);
  const GgmlType gate_act = ActivationTypeFor(mix.gate), up_act = ActivationTypeFor(up_type);
  std::vector<uint8_t> xa(RowBytes(gate_act, E)), xu(RowBytes(up_act, E));
  std::vector<uint8_t> ha(RowBytes(down_act, F));
  for (int p = 0; p < n_pairs; ++p) {
    const int e = chosen[p];
    QuantizeRow(gate_act, &x[(p / K) * E], xa.data(), E);
    QuantizeRow(up_act, &x[(p / K) * E], xu.data(), E);
    std::vector<float> g(F), u(F);
    EngineRowDots(mix.gate, gate[e].data(), F, xa.data(), E, g.data());
    EngineRowDots(up_type, up[e].data(), F, xu.data(), E, u.data());
    cpu::SwiGlu(g.data(), u.data(), static_cast<int64_t>(g.size()));
    std::copy(g.begin(), g.end(), &h_want[p * F]);
    QuantizeRow(down_act, g.data(), ha.data(), F);
    EngineRowDots(mix.down, down[e].data(), E, ha.data(), F, &out_want[p * E]);
  }

  float* dx = ToDevice(x);
  DeviceAct x_act(gate_act, E, n), x_up_act(up_act, E, n);
  cuda::LaunchQuantize(dx, E, n, E, x_act.act, nullptr);
  cuda::LaunchQuantize(dx, E, n, E, x_up_act.act, nullptr);
  float* h = DeviceNaN<float>(n_pairs * F);
  float* out = DeviceNaN<float>(n_pairs * E);
  DeviceAct h_act(down_act, F, n_pairs);
  cuda::ExpertArgs a{};
  a.type = static_cast<int>(mix.gate);
  a.up_type = static_cast<int>(up_type);
  a.down_type = static_cast<int>(mix.down);
  a.arena = arena;
  a.slot_bytes = slot_bytes;
  a.slot_table = d_slots;
  a.up_offset = up_offset;
  a.down_offset = down_offset;
  a.n_embd = E;
  a.n_ff = F;
  a.k = K;
  a.n_used = groups.n_used;
  a.used = groups.used;
  a.begin = groups.begin;
  a.pairs = groups.pairs;
  a.u_begin = 0;
  a.u_count = std::min(NE, n_pairs);
  if (up_type == mix.gate) {
    cuda::LaunchExpertGateUp(a, x_act.act, h, n, nullptr);
  } else {
    cuda::LaunchExpertGateUpMixed(a, x_act.act, x_up_act.act, h, n, nullptr);
  }
  cuda::LaunchQuantize(h, F, n_pairs, F, h_act.act, nullptr);
  cuda::LaunchExpertDown(a, h_act.act, out, n, nullptr);
  const std::string name = std::string(TypeName(mix.gate)) + " gate, " + std::string(TypeName(up_type)) + " up, " +
                           std::string(TypeName(mix.down)) + " down, " + std::to_string(n) + " tokens";
  const double h_bound = n > 1 ? tolerance : 0, out_bound = n > 1 ? 1000 * tolerance : 0;
  ExpertOutputs got{ToHost(h, n_pairs * F), ToHost(out, n_pairs * E)};
  EXPECT_EQ(Mismatch(got.h, h_want, F, h_bound), "") << name << ": SwiGLU output h (token = pair)";
  EXPECT_EQ(Mismatch(got.out, out_want, E, out_bound), "") << name << ": down output (token = pair)";
  if (n == 1 && cuda::ExpertDownConvertsInput(a.down_type, F)) {
    float* out_f32 = DeviceNaN<float>(n_pairs * E);
    cuda::LaunchExpertDownFromF32(a, h, out_f32, nullptr);
    EXPECT_EQ(Mismatch(ToHost(out_f32, n_pairs * E), out_want, E), "") << name << ": down converting h itself";
    CUDA_CHECK(cudaFree(out_f32));
  }
  for (void* p : sources) CUDA_CHECK(cudaFree(p));
  for (void* p :
       {(void*)arena, (void*)d_slots, (void*)d_chosen, (void*)buf, (void*)lookups, (void*)dx, (void*)h, (void*)out})
    CUDA_CHECK(cudaFree(p));
  return got;
}

TEST(CudaKernels, ExpertsMatchCpu) {
  for (ExpertMix mix : {ExpertMix{GgmlType::kQ4_K, GgmlType::kQ6_K, 768, 512},
                        ExpertMix{GgmlType::kQ4_K, GgmlType::kQ4_K, 768, 512},
                        ExpertMix{GgmlType::kQ4_K, GgmlType::kQ8_0, 768, 512},
                        ExpertMix{GgmlType::kQ6_K, GgmlType::kQ6_K, 768, 512},
                        ExpertMix{GgmlType::kQ5_K, GgmlType::kQ6_K, 768, 512},
                        ExpertMix{GgmlType::kQ5_K, GgmlType::kQ5_K, 768, 512},
                        ExpertMix{GgmlType::kQ5_K, GgmlType::kQ8_0, 768, 512},
                        ExpertMix{GgmlType::kIQ4_XS, GgmlType::kIQ4_XS, 768, 512},
                        ExpertMix{GgmlType::kIQ4_XS, GgmlType::kQ5_K, 768, 512},
                        ExpertMix{GgmlType::kIQ2_XXS, GgmlType::kIQ2_XXS, 768, 512},
                        ExpertMix{GgmlType::kIQ2_XXS, GgmlType::kQ8_0, 768, 512},
                        ExpertMix{GgmlType::kQ6_K, GgmlType::kIQ2_XXS, 768, 512},
                        ExpertMix{GgmlType::kIQ4_XS, GgmlType::kIQ4_NL, 256, 128},
                        ExpertMix{GgmlType::kIQ2_XXS, GgmlType::kIQ4_NL, 256, 128},
                        ExpertMix{GgmlType::kQ4_0, GgmlType::kQ4_0, 256, 160},
                        ExpertMix{GgmlType::kIQ4_NL, GgmlType::kIQ4_NL, 768, 512},
                        ExpertMix{GgmlType::kQ3_K, GgmlType::kQ5_K, 768, 512},
                        ExpertMix{GgmlType::kQ3_K, GgmlType::kQ4_K, 768, 512},
                        ExpertMix{GgmlType::kQ2_K, GgmlType::kQ2_K, 768, 512},
                        ExpertMix{GgmlType::kQ2_K, GgmlType::kQ4_0, 256, 128},
                        ExpertMix{GgmlType::kIQ2_XS, GgmlType::kIQ2_XS, 768, 512},
                        ExpertMix{GgmlType::kIQ3_XXS, GgmlType::kIQ3_XXS, 768, 512},
                        ExpertMix{GgmlType::kIQ3_XXS, GgmlType::kIQ4_NL, 256, 128},
                        ExpertMix{GgmlType::kIQ2_XS, GgmlType::kQ6_K, 768, 512},
                        ExpertMix{GgmlType::kIQ3_S, GgmlType::kIQ3_S, 768, 512},
                        ExpertMix{GgmlType::kIQ2_S, GgmlType::kIQ2_S, 768, 512},
                        ExpertMix{GgmlType::kIQ1_S, GgmlType::kIQ1_S, 768, 512},
                        ExpertMix{GgmlType::kIQ1_S, GgmlType::kIQ3_S, 768, 512},
                        ExpertMix{GgmlType::kIQ3_S, GgmlType::kIQ2_S, 768, 512},
                        ExpertMix{GgmlType::kIQ2_S, GgmlType::kIQ1_S, 768, 512},
                        ExpertMix{GgmlType::kQ4_K, GgmlType::kIQ1_S, 768, 512},
                        ExpertMix{GgmlType::kIQ3_S, GgmlType::kQ8_0, 768, 512},
                        ExpertMix{GgmlType::kIQ1_S, GgmlType::kIQ4_NL, 256, 128},
                        ExpertMix{GgmlType::kIQ2_S, GgmlType::kQ5_1, 256, 160},
                        ExpertMix{GgmlType::kQ3_K, GgmlType::kQ5_0, 256, 128},
                        ExpertMix{GgmlType::kQ5_0, GgmlType::kQ5_0, 256, 160},
                        ExpertMix{GgmlType::kQ4_1, GgmlType::kQ4_1, 256, 160},
                        ExpertMix{GgmlType::kQ5_K, GgmlType::kQ5_1, 256, 128}}) {  // Q8_0: Q8_0ExpertsMatchCpu
    for (int n : {1, 5, 40}) ExpertsMatchCpuFor(mix, n);  // 40: ~13 pairs per expert, several passes
  }
}

// Gate and up of different types (LaunchExpertGateUpMixed): K-quants of one activation type
// (Q8_K), pairs whose activations differ (Q8_0 and Q8_K, Q8_K and Q8_1, F16 and Q8_0, BF16 and
// F32), two weight types of one activation type (Q8_0 and Q4_0, Q5_0 and IQ4_NL), the grid IQ
// types and the 32-element types beside each other; one token (the decode launches, and down
// converting h itself), a few pairs per expert and several passes.
TEST(CudaKernels, MixedGateUpExpertsMatchCpu) {
  using T = GgmlType;
  for (ExpertMix mix :
       {ExpertMix{T::kQ4_K, T::kQ6_K, 768, 512, T::kQ5_K}, ExpertMix{T::kQ8_0, T::kQ4_K, 768, 512, T::kIQ4_XS},
        ExpertMix{T::kIQ2_XXS, T::kQ8_0, 768, 512, T::kIQ3_S}, ExpertMix{T::kIQ4_XS, T::kQ8_0, 768, 512, T::kQ8_0},
        ExpertMix{T::kQ3_K, T::kQ5_1, 256, 160, T::kQ4_1}, ExpertMix{T::kQ5_1, T::kIQ1_S, 256, 512, T::kIQ2_S},
        ExpertMix{T::kF16, T::kQ4_0, 256, 160, T::kQ8_0}, ExpertMix{T::kBF16, T::kF16, 96, 224, T::kF32},
        ExpertMix{T::kQ8_0, T::kQ5_0, 160, 96, T::kQ4_0}, ExpertMix{T::kQ5_0, T::kIQ4_NL, 256, 128, T::kIQ4_NL},
        ExpertMix{T::kIQ1_S, T::kQ2_K, 768, 512, T::kIQ2_XS}, ExpertMix{T::kIQ3_XXS, T::kQ6_K, 768, 512, T::kQ6_K},
        ExpertMix{T::kQ2_K, T::kBF16, 256, 128, T::kQ5_0}}) {
    for (int n : {1, 5, 40}) ExpertsMatchCpuFor(mix, n);  // 40: ~13 pairs per expert, several passes
  }
}

// Q8_0 experts in every path: one pair per expert (decode), the staged dp4a kernels and the
// tensor-core kernels (mma_q8_0.cuh) with 1 and 2 tiles and several chunks of 16 pairs (100 tokens: ~33 pairs per expert), rows of
// whole runs of 4 blocks and with blocks past the last run (160 and 96 columns), a down matrix
// whose rows end inside a warp's 16.
TEST(CudaKernels, Q8_0ExpertsMatchCpu) {
  using cuda::MultiTokenQ8_0;
  for (MultiTokenQ8_0 kernels : {MultiTokenQ8_0::kDp4a, MultiTokenQ8_0::kMmaExact, MultiTokenQ8_0::kMmaFast}) {
    SCOPED_TRACE(kernels == MultiTokenQ8_0::kMmaFast    ? "fast tensor-core kernels"
                 : kernels == MultiTokenQ8_0::kMmaExact ? "tensor-core kernels"
                                                        : "dp4a kernels");
    cuda::SetMultiTokenQ8_0(kernels);
    const double tolerance = kernels == MultiTokenQ8_0::kMmaFast ? 1e-5 : 0;
    for (ExpertMix mix :
         {ExpertMix{GgmlType::kQ8_0, GgmlType::kQ8_0, 2048, 768}, ExpertMix{GgmlType::kQ8_0, GgmlType::kQ8_0, 768, 512},
          ExpertMix{GgmlType::kQ8_0, GgmlType::kQ8_0, 160, 96}, ExpertMix{GgmlType::kQ8_0, GgmlType::kQ8_0, 96, 224}})
      for (int n : {1, 3, 5, 40, 100}) ExpertsMatchCpuFor(mix, n, tolerance);
  }
  cuda::SetMultiTokenQ8_0(MultiTokenQ8_0::kAuto);
}

// The fast form's Q4_K, Q5_K and Q6_K products on the tensor cores (mma_kquant_tiles.cuh), within
// 1e-5 of the largest output of the CPU's (down 1e-2: its input h is quantized again from the GPU's):
// mat-vecs of 1 to 1,000 rows (tiles spanning matrices, rows ending inside a tile), 2 to 130 tokens
// (32 and 64 tokens per tile, tokens ending inside one), with the tiles wherever they fit and by
// shape; experts of 2 to ~100 pairs each, Q4_K, Q5_K or Q6_K gate/up beside a down of one of them
// or of another type (Q3_K gate/up, Q8_0 down: the other kernels).
TEST(CudaKernels, KQuantFastTilesMatchCpu) {
  using cuda::FastTiles;
  struct Size {
    int64_t rows, cols;
  };
  cuda::SetMultiTokenQ8_0(cuda::MultiTokenQ8_0::kMmaFast);
  cuda::SetKQuantTiles(true);
  for (FastTiles tiles : {FastTiles::kAlways, FastTiles::kByShape}) {
    SCOPED_TRACE(tiles == FastTiles::kAlways ? "tiles wherever they fit" : "tiles by shape");
    cuda::SetFastTiles(tiles);
    for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K})
      for (Size sz : {Size{1, 256}, Size{100, 2048}, Size{1000, 4096}, Size{64, 768}, Size{130, 256}})
        for (int n : {2, 33, 130}) KQuantMatvecMatchesCpuFor(type, sz.rows, sz.cols, n, 1e-5);
    for (ExpertMix mix :
         {ExpertMix{GgmlType::kQ4_K, GgmlType::kQ4_K, 768, 512}, ExpertMix{GgmlType::kQ4_K, GgmlType::kQ6_K, 2048, 768},
          ExpertMix{GgmlType::kQ6_K, GgmlType::kQ6_K, 768, 512}, ExpertMix{GgmlType::kQ6_K, GgmlType::kQ8_0, 768, 512},
          ExpertMix{GgmlType::kQ5_K, GgmlType::kQ6_K, 768, 512},
          ExpertMix{GgmlType::kQ3_K, GgmlType::kQ4_K, 256, 1280}})
      for (int n : {1, 5, 40, 300}) ExpertsMatchCpuFor(mix, n, 1e-5);
  }
  cuda::SetKQuantTiles(false);
  cuda::SetFastTiles(FastTiles::kByShape);
  cuda::SetMultiTokenQ8_0(cuda::MultiTokenQ8_0::kAuto);
}

// The fast form's products of n tokens by Q8_0 matrices of `rows` each over `cols` columns, all in
// one launch as Q/K/V (the last with a residual), with the shared-memory tiles wherever they fit
// or never (cuda::SetFastTiles); *cpu: the CPU engine's products. The same seed for the same case.
std::vector<float> FastQ8_0Matvec(const std::vector<int64_t>& rows, int64_t cols, int n, bool tiled,
                                  std::vector<float>* cpu) {
  rng.seed(static_cast<unsigned>(7 * cols + n));
  cuda::SetMultiTokenQ8_0(cuda::MultiTokenQ8_0::kMmaFast);
  cuda::SetFastTiles(tiled ? cuda::FastTiles::kAlways : cuda::FastTiles::kOff);
  const int64_t rb = RowBytes(GgmlType::kQ8_0, cols);
  const std::vector<float> x = Random(n * cols);
  float* dx = ToDevice(x);
  DeviceAct a(GgmlType::kQ8_0, cols, n);
  cuda::LaunchQuantize(dx, cols, n, cols, a.act, nullptr);
  std::vector<uint8_t> act(rb);
  std::vector<cuda::MatvecOutput> outs;
  std::vector<void*> buffers = {dx};
  std::vector<float> want;
  for (size_t m = 0; m < rows.size(); ++m) {
    const std::vector<float> wf = Random(rows[m] * cols, 0.05f);
    std::vector<uint8_t> w(rows[m] * rb);
    for (int64_t r = 0; r < rows[m]; ++r) QuantizeRow(GgmlType::kQ8_0, &wf[r * cols], &w[r * rb], cols);
    const bool residual = m + 1 == rows.size();
    const std::vector<float> res = Random(n * rows[m]);
    for (int t = 0; t < n; ++t) {
      QuantizeRow(GgmlType::kQ8_0, &x[t * cols], act.data(), cols);
      for (int64_t r = 0; r < rows[m]; ++r) {
        const float dot = VecDot(GgmlType::kQ8_0, &w[r * rb], act.data(), cols);
        want.push_back(residual ? res[t * rows[m] + r] + dot : dot);
      }
    }
    uint8_t* raw = ToDevice(w);
    uint8_t* dw = DeviceNaN<uint8_t>(w.size());
    const cuda::RepackJob job{raw, dw, int64_t(w.size()), cols};
    cuda::LaunchRepack(static_cast<int>(GgmlType::kQ8_0), &job, 1, nullptr);
    float* out = residual ? ToDevice(res) : DeviceNaN<float>(n * rows[m]);
    outs.push_back({cuda::DevMatrix{static_cast<int>(GgmlType::kQ8_0), rows[m], cols, dw}, out, rows[m],
                    residual ? out : nullptr});
    buffers.insert(buffers.end(), {raw, dw, out});
  }
  cuda::LaunchMatvec(outs.data(), static_cast<int>(outs.size()), a.act, n, nullptr);
  std::vector<float> got;
  for (const cuda::MatvecOutput& o : outs) {
    const std::vector<float> part = ToHost(o.out, n * o.w.rows);
    got.insert(got.end(), part.begin(), part.end());
  }
  for (void* p : buffers) CUDA_CHECK(cudaFree(p));
  if (cpu != nullptr) *cpu = std::move(want);
  cuda::SetFastTiles(cuda::FastTiles::kByShape);
  cuda::SetMultiTokenQ8_0(cuda::MultiTokenQ8_0::kAuto);
  return got;
}

// The fast form's shared-memory tiles (mma_q8_0_tiles.cuh) give the warp kernels' bits
// (mma_q8_0.cuh), for mat-vecs (32 and 64 tokens per tile, tiles spanning two matrices of one
// launch, tokens and rows that end inside a tile) and experts (2 to ~67 pairs per expert), with the
// tiles wherever they fit (FastTiles::kAlways); rows that are not a multiple of 16, which the warp
// kernels do not take, against the CPU within the fast form's bound.
TEST(CudaKernels, FastTilesGiveTheWarpKernelsBits) {
  struct Case {
    std::vector<int64_t> rows;
    int64_t cols;
    int n;
  };
  for (const Case& c : {Case{{48}, 128, 3}, Case{{48}, 128, 32}, Case{{1040}, 2048, 100}, Case{{64, 16, 16}, 256, 64},
                        Case{{144, 48, 48}, 4096, 47}, Case{{512}, 768, 130}, Case{{32, 96}, 384, 200}}) {
    std::vector<float> cpu;
    const std::vector<float> tiles = FastQ8_0Matvec(c.rows, c.cols, c.n, true, &cpu);
    const std::vector<float> warps = FastQ8_0Matvec(c.rows, c.cols, c.n, false, nullptr);
    const std::string name = std::to_string(c.rows[0]) + " rows first, " + std::to_string(c.cols) + " cols, " +
                             std::to_string(c.n) + " tokens";
    EXPECT_EQ(Mismatch(tiles, warps, c.rows[0]), "") << name << ": tiles against warp kernels";
    EXPECT_EQ(Mismatch(tiles, cpu, c.rows[0], 1e-5), "") << name << ": tiles against the CPU";
  }
  for (const Case& c : {Case{{70}, 256, 40}, Case{{33, 7}, 128, 64}}) {
    std::vector<float> cpu;
    const std::vector<float> tiles = FastQ8_0Matvec(c.rows, c.cols, c.n, true, &cpu);
    EXPECT_EQ(Mismatch(tiles, cpu, c.rows[0], 1e-5), "") << c.rows[0] << " rows: tiles against the CPU";
  }
  cuda::SetMultiTokenQ8_0(cuda::MultiTokenQ8_0::kMmaFast);
  for (ExpertMix mix :
       {ExpertMix{GgmlType::kQ8_0, GgmlType::kQ8_0, 2048, 768}, ExpertMix{GgmlType::kQ8_0, GgmlType::kQ8_0, 768, 512},
        ExpertMix{GgmlType::kQ8_0, GgmlType::kQ8_0, 256, 384}}) {
    // ~2, ~20, ~33, ~67 and 100 pairs per expert: tiles of 32, 32, 32, 64 and 64 tokens, 2 passes
    // of them at 300 tokens.
    for (int n : {5, 60, 100, 200, 300}) {
      SCOPED_TRACE(std::to_string(mix.E) + " x " + std::to_string(mix.F) + ", " + std::to_string(n) + " tokens");
      rng.seed(static_cast<unsigned>(mix.E + n));
      cuda::SetFastTiles(cuda::FastTiles::kAlways);
      const ExpertOutputs tiles = ExpertsMatchCpuFor(mix, n, 1e-5);
      rng.seed(static_cast<unsigned>(mix.E + n));
      cuda::SetFastTiles(cuda::FastTiles::kOff);
      const ExpertOutputs warps = ExpertsMatchCpuFor(mix, n, 1e-5);
      EXPECT_EQ(Mismatch(tiles.h, warps.h, mix.F), "") << "SwiGLU output h: tiles against warp kernels";
      EXPECT_EQ(Mismatch(tiles.out, warps.out, mix.E), "") << "down output: tiles against warp kernels";
    }
  }
  cuda::SetFastTiles(cuda::FastTiles::kByShape);
  cuda::SetMultiTokenQ8_0(cuda::MultiTokenQ8_0::kAuto);
}

}  // namespace
}  // namespace mer
