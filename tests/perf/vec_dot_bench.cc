// Micro-benchmark of VecDotRows, the decode matrix-vector product, per weight type and kernel
// variant: a weight matrix of `rows` rows of `cols` elements (default 768 x 2048, i.e. a 2048 x 768
// ggml tensor) times one activation row, single-threaded. Prints weight bytes streamed per second.
// Every SIMD variant the CPU runs is measured, in alternating batches so that a change in the
// machine's speed hits them alike; with MER_CPU_KERNELS set, only that variant (scalar included).
//   vec_dot_bench [cols rows [seconds per type]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/quant/kernel_variant.h"
#include "common/quant/quant.h"

int main(int argc, char** argv) {
  using mer::GgmlType;
  using mer::KernelVariant;
  // cols: the dot product length, a multiple of 256.
  const int64_t cols = argc > 2 ? std::atoll(argv[1]) : 2048;
  const int64_t rows = argc > 2 ? std::atoll(argv[2]) : 768;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 1.0;
  const absl::StatusOr<KernelVariant> forced = mer::KernelVariantFromEnvironment();
  if (!forced.ok()) {
    std::fprintf(stderr, "vec_dot_bench: %s\n", std::string(forced.status().message()).c_str());
    return 2;
  }
  std::vector<KernelVariant> variants;
  const char* env = std::getenv("MER_CPU_KERNELS");
  if (env != nullptr && *env != '\0' && std::string(env) != "auto") {
    variants.push_back(*forced);
  } else {
    for (KernelVariant v : mer::kKernelVariants)
      if (v != KernelVariant::kScalar && mer::CpuSupports(v)) variants.push_back(v);
  }

  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(rows * cols), x(cols);
  for (auto& v : w) v = normal(rng) * 0.02f;
  for (auto& v : x) v = normal(rng);

  std::printf("%lld x %lld weights, single thread, best of alternating batches\n", static_cast<long long>(rows),
              static_cast<long long>(cols));
  std::printf("%-5s %-7s %10s %12s %10s\n", "type", "kernels", "MiB", "us/matvec", "GB/s");
  for (GgmlType type : {GgmlType::kF32,     GgmlType::kF16,    GgmlType::kBF16,    GgmlType::kQ8_0,   GgmlType::kQ4_0,
                        GgmlType::kQ4_1,    GgmlType::kQ5_0,   GgmlType::kQ5_1,    GgmlType::kQ6_K,   GgmlType::kQ5_K,
                        GgmlType::kQ4_K,    GgmlType::kQ3_K,   GgmlType::kQ2_K,    GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
                        GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ3_XXS, GgmlType::kIQ2_S,  GgmlType::kIQ3_S,
                        GgmlType::kIQ1_S}) {
    const int64_t row_bytes = mer::RowBytes(type, cols);
    std::vector<uint8_t> weights(row_bytes * rows);
    for (int64_t r = 0; r < rows; ++r) {
      mer::QuantizeRow(type, w.data() + r * cols, weights.data() + r * row_bytes, cols);
    }
    const GgmlType act_type = mer::ActivationTypeFor(type);
    std::vector<uint8_t> act(mer::RowBytes(act_type, cols));
    mer::QuantizeRow(act_type, x.data(), act.data(), cols);
    std::vector<float> out(rows);

    double sink = 0;
    auto run = [&](KernelVariant v) {
      mer::VecDotRowsWith(v, type, weights.data(), rows, act.data(), cols, out.data());
      sink += out[0];
    };
    for (KernelVariant v : variants)
      for (int i = 0; i < 20; ++i) run(v);  // warm caches and clocks
    // The best of many short batches: the machine may be shared, and interference only ever
    // makes a batch slower.
    std::vector<double> best(variants.size(), 1e30);
    const auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
      for (size_t k = 0; k < variants.size(); ++k) {
        constexpr int kBatch = 10;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kBatch; ++i) run(variants[k]);
        const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best[k] = std::min(best[k], t / kBatch);
      }
    }
    const double bytes = static_cast<double>(weights.size());
    for (size_t k = 0; k < variants.size(); ++k) {
      std::printf("%-5s %-7s %10.2f %12.2f %10.2f\n", std::string(mer::TypeName(type)).c_str(),
                  mer::KernelVariantName(variants[k]), bytes / (1 << 20), best[k] * 1e6, bytes / best[k] / 1e9);
    }
    if (sink == 12345.678) std::printf(" ");  // keeps the results observable
  }
  return 0;
}
