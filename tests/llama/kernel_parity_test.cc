// mer's row kernels against llama.cpp's own, called in the prebuilt CPU library the parity tests
// run (tests/llama/node_modules, loaded with dlopen): for every quantized weight type, rows
// quantized by mer and activations quantized by both libraries (the bytes must agree), then every
// dot product of every SIMD variant this CPU runs equal bit for bit to ggml's vec_dot of the pair
// (or, for the types ggml repacks on AVX2 hosts, to its 8-row gemv on the repacked rows), and
// mer's dequantization equal bit for bit to ggml's to_float. This shows each kernel's
// arithmetic is llama.cpp's independently of the model-level comparisons, where ulp-level
// differences elsewhere can be amplified (README.md).
//
//   kernel_parity_test BINS_DIR   (the folder holding libggml-base.so and libggml-cpu-*.so)
// Exits 77 (CTest skip) where the library is not installed (scripts/install-llama-ref).
#include <dirent.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "common/quant/kernel_variant.h"
#include "common/quant/quant.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

// ggml's signatures (ggml-cpu/quants.h, ggml-quants.h).
using GgmlVecDot = void (*)(int n, float* s, size_t bs, const void* x, size_t bx, const void* y, size_t by, int nrc);
using GgmlToFloat = void (*)(const void* x, float* y, int64_t k);
using GgmlFromFloat = void (*)(const float* x, void* y, int64_t k);

void* g_base = nullptr;  // libggml-base.so: the reference dequantizers
void* g_cpu = nullptr;   // libggml-cpu-<variant>.so: the dot products and activation quantizers

template <typename F>
F Symbol(void* lib, const std::string& name) {
  F f = reinterpret_cast<F>(dlsym(lib, name.c_str()));
  EXPECT_NE(f, nullptr) << name;
  return f;
}

// ggml's name of a type in its function names: "q5_K", "q8_0", "iq4_xs".
std::string GgmlName(GgmlType type) {
  std::string s(TypeName(type));
  if (s.size() > 2 && s.compare(s.size() - 2, 2, "_k") == 0) s.back() = 'K';
  return s;
}

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale, float offset) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng) + offset;
  return x;
}

// The types whose kernels follow ggml's vec_dot, and those that follow the 8-row gemv ggml runs
// on them after repacking (legacy.h).
constexpr GgmlType kVecDotTypes[] = {GgmlType::kQ4_1,  GgmlType::kQ5_0,    GgmlType::kQ5_1,    GgmlType::kQ8_0,
                                     GgmlType::kQ2_K,  GgmlType::kQ3_K,    GgmlType::kQ4_K,    GgmlType::kQ5_K,
                                     GgmlType::kQ6_K,  GgmlType::kIQ4_XS,  GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS,
                                     GgmlType::kIQ2_S, GgmlType::kIQ3_XXS, GgmlType::kIQ3_S,   GgmlType::kIQ1_S};
constexpr GgmlType kGemvTypes[] = {GgmlType::kQ4_0, GgmlType::kIQ4_NL};
constexpr int64_t kRows = 16;  // two groups of 8 rows for the gemv

std::vector<KernelVariant> SimdVariantsHere() {
  std::vector<KernelVariant> v;
  for (KernelVariant k : kKernelVariants) {
    if (k != KernelVariant::kScalar && CpuSupports(k)) v.push_back(k);
  }
  return v;
}

// ggml's 8-row gemv (ggml_gemv_<type>_8x8_q8_0) of 8 consecutive rows: the rows' blocks
// interleaved as its repacking lays them out (per block the 8 rows' f16 scales, then 8 bytes of
// each row's quants in turn, twice; Q4_0's nibbles xor 8, its codes as signed nibbles).
using GgmlGemv = void (*)(int n, float* s, size_t bs, const void* x, const void* y, int nr, int nc);
void Gemv8(GgmlGemv gemv, GgmlType type, const uint8_t* rows, int64_t n, const void* act, float* out) {
  const int64_t nb = n / 32, block_bytes = Traits(type).block_bytes;
  std::vector<uint8_t> packed(nb * 8 * block_bytes);
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* dst = packed.data() + b * 8 * block_bytes;
    for (int r = 0; r < 8; ++r) std::memcpy(dst + 2 * r, rows + (r * nb + b) * block_bytes, 2);
    for (int i = 0; i < 16; ++i) {
      const uint8_t* qs = rows + ((i % 8) * nb + b) * block_bytes + 2 + (i / 8) * 8;
      for (int k = 0; k < 8; ++k)
        dst[16 + 8 * i + k] = static_cast<uint8_t>(qs[k] ^ (type == GgmlType::kQ4_0 ? 0x88 : 0));
    }
  }
  gemv(static_cast<int>(n), out, 0, packed.data(), act, 1, 8);
}

// `rows` rows of `type` quantized by mer from random data of varied magnitudes and offsets (one
// all zero now and then), and an activation row quantized by mer and by ggml (the bytes must
// agree); `check(weights, activation, n, seed)` compares the dot products and returns how many.
template <typename Check>
int64_t ForRandomRows(GgmlType type, const std::vector<int64_t>& sizes, Check check) {
  const GgmlType act_type = ActivationTypeFor(type);
  const auto quantize_act = Symbol<GgmlFromFloat>(g_cpu, "quantize_row_" + GgmlName(act_type));
  if (quantize_act == nullptr) return 0;
  int64_t compared = 0;
  for (int64_t n : sizes) {
    if (!IsRowSizeValid(type, n)) continue;
    for (uint32_t seed = 1; seed <= 24; ++seed) {
      std::mt19937 rng(seed * 1000 + static_cast<uint32_t>(n));
      const int64_t row_bytes = RowBytes(type, n);
      std::vector<uint8_t> w(row_bytes * kRows);
      for (int64_t r = 0; r < kRows; ++r) {
        std::vector<float> x = Random(n, rng, 0.01f * (1 + (seed + r) % 9), 0.004f * (r % 3));
        if (r == 5 && seed % 4 == 0) std::fill(x.begin(), x.end(), 0.0f);
        QuantizeRow(type, x.data(), w.data() + r * row_bytes, n);
      }
      const std::vector<float> x = Random(n, rng, 0.5f + seed % 4, 0.0f);
      std::vector<uint8_t> act(RowBytes(act_type, n)), ggml_act(act.size());
      QuantizeRow(act_type, x.data(), act.data(), n);
      quantize_act(x.data(), ggml_act.data(), n);
      EXPECT_EQ(act, ggml_act) << "activation bytes, " << TypeName(type) << " n=" << n;
      compared += check(w, act, n, seed);
    }
  }
  return compared;
}

const std::vector<int64_t> kSizes = {32, 96, 256, 512, 1024, 2048, 4096};

TEST(KernelParity, DotProductsEqualGgmlVecDotBitForBit) {
  for (GgmlType type : kVecDotTypes) {
    const auto vec_dot =
        Symbol<GgmlVecDot>(g_cpu, "ggml_vec_dot_" + GgmlName(type) + "_" + GgmlName(ActivationTypeFor(type)));
    if (vec_dot == nullptr) continue;
    const int64_t compared = ForRandomRows(
        type, kSizes, [&](const std::vector<uint8_t>& w, const std::vector<uint8_t>& act, int64_t n, uint32_t seed) {
          const int64_t row_bytes = RowBytes(type, n);
          int64_t count = 0;
          for (KernelVariant v : SimdVariantsHere()) {
            float out[kRows];
            VecDotRowsWith(v, type, w.data(), kRows, act.data(), n, out);
            for (int64_t r = 0; r < kRows; ++r) {
              float want;
              vec_dot(static_cast<int>(n), &want, 0, w.data() + r * row_bytes, 0, act.data(), 0, 1);
              EXPECT_EQ(out[r], want) << KernelVariantName(v) << " " << TypeName(type) << " n=" << n << " seed " << seed
                                      << " row " << r;
              ++count;
            }
          }
          return count;
        });
    std::printf("%-7s %lld dot products equal to ggml's vec_dot\n", std::string(TypeName(type)).c_str(),
                static_cast<long long>(compared));
  }
}

TEST(KernelParity, DotProductsEqualGgmlGemvBitForBit) {
  for (GgmlType type : kGemvTypes) {
    const auto gemv = Symbol<GgmlGemv>(g_cpu, "ggml_gemv_" + GgmlName(type) + "_8x8_q8_0");
    if (gemv == nullptr) continue;
    const int64_t compared = ForRandomRows(
        type, kSizes, [&](const std::vector<uint8_t>& w, const std::vector<uint8_t>& act, int64_t n, uint32_t seed) {
          const int64_t row_bytes = RowBytes(type, n);
          float want[kRows];
          for (int64_t r = 0; r < kRows; r += 8) Gemv8(gemv, type, w.data() + r * row_bytes, n, act.data(), want + r);
          int64_t count = 0;
          for (KernelVariant v : SimdVariantsHere()) {
            // All rows (groups of 8), then each row alone (mer's kernel for rows left over).
            float out[kRows];
            VecDotRowsWith(v, type, w.data(), kRows, act.data(), n, out);
            for (int64_t r = 0; r < kRows; ++r) {
              float one;
              VecDotRowsWith(v, type, w.data() + r * row_bytes, 1, act.data(), n, &one);
              EXPECT_EQ(out[r], want[r]) << KernelVariantName(v) << " " << TypeName(type) << " n=" << n << " seed "
                                         << seed << " row " << r;
              EXPECT_EQ(one, want[r]) << KernelVariantName(v) << " " << TypeName(type) << " n=" << n << " seed " << seed
                                      << " row " << r << " alone";
              count += 2;
            }
          }
          return count;
        });
    std::printf("%-7s %lld dot products equal to ggml's gemv\n", std::string(TypeName(type)).c_str(),
                static_cast<long long>(compared));
  }
}

TEST(KernelParity, DequantizationEqualsGgml) {
  std::vector<GgmlType> types(std::begin(kVecDotTypes), std::end(kVecDotTypes));
  types.insert(types.end(), std::begin(kGemvTypes), std::end(kGemvTypes));
  for (GgmlType type : types) {
    const auto to_float = Symbol<GgmlToFloat>(g_base, "dequantize_row_" + GgmlName(type));
    if (to_float == nullptr) continue;
    const int64_t n = 4096;
    std::mt19937 rng(static_cast<uint32_t>(type));
    const std::vector<float> x = Random(n, rng, 0.05f, 0.01f);
    std::vector<uint8_t> q(RowBytes(type, n));
    QuantizeRow(type, x.data(), q.data(), n);
    std::vector<float> got(n), want(n);
    DequantizeRow(type, q.data(), got.data(), n);
    to_float(q.data(), want.data(), n);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float))) << TypeName(type);
  }
}

// The library's libggml-cpu-*.so (install-llama-ref leaves one).
std::string CpuLibrary(const std::string& dir) {
  std::string found;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("libggml-cpu-", 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0)
        found = name;
    }
    closedir(d);
  }
  return found;
}

}  // namespace
}  // namespace mer

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: kernel_parity_test BINS_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::string cpu = mer::CpuLibrary(dir);
  mer::g_base = dlopen((dir + "/libggml-base.so").c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (mer::g_base == nullptr || cpu.empty()) {
    std::printf("SKIP: the llama.cpp reference is not installed in %s (run scripts/install-llama-ref)\n", dir.c_str());
    return 77;
  }
  mer::g_cpu = dlopen((dir + "/" + cpu).c_str(), RTLD_NOW);
  if (mer::g_cpu == nullptr) {
    std::printf("cannot load %s: %s\n", cpu.c_str(), dlerror());
    return 1;
  }
  // Sets up ggml's f16 tables and CPU feature flags, as any ggml program does first.
  reinterpret_cast<void (*)()>(dlsym(mer::g_cpu, "ggml_cpu_init"))();
  std::printf("reference: %s\n", cpu.c_str());
  return RUN_ALL_TESTS();
}
