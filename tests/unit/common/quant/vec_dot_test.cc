// VecDot / VecDotRows against a double-precision reference on the dequantized operands, and every
// kernel variant the CPU runs against the scalar one and the SIMD variants against each other,
// for every weight type; the run-time choice of the variant.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/quant/float_dot.h"
#include "common/quant/kernel_variant.h"
#include "common/quant/q4_k.h"
#include "common/quant/q6_k.h"
#include "common/quant/q8_0.h"
#include "common/quant/quant.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

constexpr GgmlType kWeightTypes[] = {
    GgmlType::kF32,   GgmlType::kF16,    GgmlType::kBF16,   GgmlType::kQ4_0,    GgmlType::kQ4_1,   GgmlType::kQ5_0,
    GgmlType::kQ5_1,  GgmlType::kQ8_0,   GgmlType::kQ2_K,   GgmlType::kQ3_K,    GgmlType::kQ4_K,   GgmlType::kQ5_K,
    GgmlType::kQ6_K,  GgmlType::kIQ4_NL, GgmlType::kIQ4_XS, GgmlType::kIQ2_XXS, GgmlType::kIQ2_XS, GgmlType::kIQ3_XXS,
    GgmlType::kIQ3_S, GgmlType::kIQ2_S,  GgmlType::kIQ1_S};
constexpr int64_t kSizes[] = {1, 7, 16, 33, 32, 64, 96, 160, 256, 512, 768, 1024, 2048, 4096};
constexpr int64_t kRows = 11;  // groups of 8, 4 and 2 rows, and single rows

std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = normal(rng);
  return x;
}

// Quantized weight rows and activation row of one case, with their dequantized values.
struct DotCase {
  GgmlType type;
  int64_t n;
  std::vector<uint8_t> weights, activation;
  std::vector<float> w, a;  // dequantized: what the kernels multiply
};

DotCase MakeCase(GgmlType type, int64_t n, uint32_t seed) {
  DotCase c{type, n, {}, {}, {}, {}};
  const GgmlType act_type = ActivationTypeFor(type);
  const int64_t row_bytes = RowBytes(type, n);
  c.weights.resize(row_bytes * kRows);
  c.w.resize(n * kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    // Rows of different magnitudes, and a mean offset that exercises the K-quant mins.
    std::vector<float> x = Random(n, seed + r, 0.02f * (r + 1));
    for (auto& v : x) v += 0.005f * static_cast<float>(r % 3);
    QuantizeRow(type, x.data(), c.weights.data() + r * row_bytes, n);
    DequantizeRow(type, c.weights.data() + r * row_bytes, c.w.data() + r * n, n);
  }
  std::vector<float> x = Random(n, seed + 1000, 1.5f);
  c.activation.resize(RowBytes(act_type, n));
  QuantizeRow(act_type, x.data(), c.activation.data(), n);
  c.a.resize(n);
  DequantizeRow(act_type, c.activation.data(), c.a.data(), n);
  return c;
}

struct Reference {
  double dot;
  double abs_sum;  // sum |w * a|: the scale of the rounding error any summation order makes
};

// Q4_1 and Q5_1 take a block's m term as m * s, with s the activation block's d * (sum of its
// quants) rounded to f16 (ggml's Q8_1), not as m * d * sum: the difference, per block.
template <typename W>
double MinTermDifference(const DotCase& c, int64_t r) {
  const int64_t nb = c.n / kQ8_0BlockSize;
  const W* w = reinterpret_cast<const W*>(c.weights.data()) + r * nb;
  const BlockQ8_1* a = reinterpret_cast<const BlockQ8_1*>(c.activation.data());
  double diff = 0;
  for (int64_t b = 0; b < nb; ++b) {
    int sum = 0;
    for (int i = 0; i < kQ8_0BlockSize; ++i) sum += a[b].qs[i];
    diff += double(F16ToF32(w[b].m)) * (double(F16ToF32(a[b].s)) - double(F16ToF32(a[b].d)) * sum);
  }
  return diff;
}

Reference Ref(const DotCase& c, int64_t r) {
  Reference ref{0, 0};
  for (int64_t i = 0; i < c.n; ++i) {
    const double p = double(c.w[r * c.n + i]) * c.a[i];
    ref.dot += p;
    ref.abs_sum += std::fabs(p);
  }
  if (c.type == GgmlType::kQ4_1) ref.dot += MinTermDifference<BlockQ4_1>(c, r);
  if (c.type == GgmlType::kQ5_1) ref.dot += MinTermDifference<BlockQ5_1>(c, r);
  return ref;
}

// Relative to sum |w * a|: f32 accumulation of up to 4096 terms, and for the K-quants two f32
// terms per block (d and dmin parts) that may each be a few times larger than the result.
double Tolerance(GgmlType type) { return Traits(type).block_elements == 256 ? 2e-6 : 1e-6; }

bool Applies(GgmlType type, int64_t n) { return IsRowSizeValid(type, n); }

TEST(VecDot, MatchesDoubleReferenceOnDequantizedOperands) {
  for (GgmlType type : kWeightTypes) {
    double worst = 0;
    for (int64_t n : kSizes) {
      if (!Applies(type, n)) continue;
      const DotCase c = MakeCase(type, n, static_cast<uint32_t>(n));
      const int64_t row_bytes = RowBytes(type, n);
      float out[kRows];
      VecDotRows(type, c.weights.data(), kRows, c.activation.data(), n, out);
      for (int64_t r = 0; r < kRows; ++r) {
        const Reference ref = Ref(c, r);
        const double err = std::fabs(out[r] - ref.dot) / (ref.abs_sum + 1e-30);
        worst = std::max(worst, err);
        EXPECT_LE(err, Tolerance(type)) << TypeName(type) << " n=" << n << " row " << r << ": " << out[r] << " vs "
                                        << ref.dot;
        // The single-row entry point is the same kernel, bit for bit.
        EXPECT_EQ(VecDot(type, c.weights.data() + r * row_bytes, c.activation.data(), n), out[r])
            << TypeName(type) << " n=" << n << " row " << r;
      }
    }
    std::printf("%-5s worst |dot - ref| / sum|w*a| = %.2e\n", std::string(TypeName(type)).c_str(), worst);
  }
}

TEST(VecDot, RowGroupingDoesNotChangeResults) {
  for (GgmlType type : kWeightTypes) {
    const int64_t n = 512;
    const DotCase c = MakeCase(type, n, 77);
    const int64_t row_bytes = RowBytes(type, n);
    float all[kRows];
    VecDotRows(type, c.weights.data(), kRows, c.activation.data(), n, all);
    for (int64_t start = 0; start < kRows; ++start) {
      float part[kRows];
      VecDotRows(type, c.weights.data() + start * row_bytes, kRows - start, c.activation.data(), n, part);
      for (int64_t r = start; r < kRows; ++r) EXPECT_EQ(part[r - start], all[r]) << TypeName(type);
    }
  }
  float unused = 1.0f;
  VecDotRows(GgmlType::kQ8_0, nullptr, 0, nullptr, 32, &unused);  // zero rows: no access
  EXPECT_EQ(unused, 1.0f);
}

// The variants this CPU runs, the widest first (scalar last).
std::vector<KernelVariant> VariantsHere() {
  std::vector<KernelVariant> v;
  for (KernelVariant k : kKernelVariants) {
    if (CpuSupports(k)) v.push_back(k);
  }
  return v;
}
// The same without scalar.
std::vector<KernelVariant> SimdVariantsHere() {
  std::vector<KernelVariant> v = VariantsHere();
  v.pop_back();
  return v;
}

TEST(VecDot, EverySimdVariantMatchesScalarAndTheOthersBitForBit) {
  const std::vector<KernelVariant> variants = SimdVariantsHere();
  ASSERT_FALSE(variants.empty()) << "every mer binary needs AVX2";
  for (KernelVariant v : variants) std::printf("comparing %s\n", KernelVariantName(v));
  for (GgmlType type : kWeightTypes) {
    for (int64_t n : kSizes) {
      if (!Applies(type, n)) continue;
      const DotCase c = MakeCase(type, n, 1234 + static_cast<uint32_t>(n));
      float scalar[kRows], avx2[kRows];
      VecDotRowsWith(KernelVariant::kScalar, type, c.weights.data(), kRows, c.activation.data(), n, scalar);
      VecDotRowsWith(KernelVariant::kAvx2, type, c.weights.data(), kRows, c.activation.data(), n, avx2);
      for (KernelVariant v : variants) {
        float out[kRows];
        VecDotRowsWith(v, type, c.weights.data(), kRows, c.activation.data(), n, out);
        for (int64_t r = 0; r < kRows; ++r) {
          const double scale = Ref(c, r).abs_sum + 1e-30;
          EXPECT_LE(std::fabs(out[r] - scalar[r]) / scale, Tolerance(type))
              << KernelVariantName(v) << " " << TypeName(type) << " n=" << n << " row " << r;
          // The SIMD variants form the same exact integer lanes and the same f32 operations.
          EXPECT_EQ(out[r], avx2[r]) << KernelVariantName(v) << " " << TypeName(type) << " n=" << n << " row " << r;
        }
      }
    }
  }
}

TEST(VecDot, TheActiveVariantIsTheOneTheEnvironmentAsksFor) {
  const absl::StatusOr<KernelVariant> asked = KernelVariantFromEnvironment();
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(ActiveKernelVariant(), *asked);
  EXPECT_EQ(std::string(QuantKernelIsa()), KernelVariantName(*asked));
  std::printf("active kernels: %s\n", QuantKernelIsa());
  // And VecDotRows runs it.
  const DotCase c = MakeCase(GgmlType::kQ4_K, 512, 5);
  float active[kRows], want[kRows];
  VecDotRows(GgmlType::kQ4_K, c.weights.data(), kRows, c.activation.data(), 512, active);
  VecDotRowsWith(*asked, GgmlType::kQ4_K, c.weights.data(), kRows, c.activation.data(), 512, want);
  for (int64_t r = 0; r < kRows; ++r) EXPECT_EQ(active[r], want[r]);
}

// Sets MER_CPU_KERNELS for the scope of one test, then restores it.
class ScopedKernelsEnv {
 public:
  explicit ScopedKernelsEnv(const char* value) {
    const char* old = std::getenv("MER_CPU_KERNELS");
    if (old != nullptr) old_ = old;
    had_ = old != nullptr;
    setenv("MER_CPU_KERNELS", value, 1);
  }
  ~ScopedKernelsEnv() {
    if (had_) {
      setenv("MER_CPU_KERNELS", old_.c_str(), 1);
    } else {
      unsetenv("MER_CPU_KERNELS");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

TEST(KernelVariantFromEnvironment, NamesAndRefusals) {
  const KernelVariant widest = SimdVariantsHere().front();
  for (const char* automatic : {"", "auto"}) {
    ScopedKernelsEnv env(automatic);
    EXPECT_EQ(*KernelVariantFromEnvironment(), widest) << "'" << automatic << "'";
  }
  for (KernelVariant v : kKernelVariants) {
    ScopedKernelsEnv env(KernelVariantName(v));
    const absl::StatusOr<KernelVariant> got = KernelVariantFromEnvironment();
    if (CpuSupports(v)) {
      EXPECT_EQ(*got, v);
      EXPECT_EQ(MissingCpuFeatures(v), "");
    } else {
      EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(got.status().message().find(MissingCpuFeatures(v)), std::string::npos) << got.status();
      EXPECT_NE(MissingCpuFeatures(v), "");
    }
  }
  {
    ScopedKernelsEnv env("avx1024");
    EXPECT_EQ(KernelVariantFromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(CpuSupports(KernelVariant::kScalar));
}

// A fresh process (the death test's) reads MER_CPU_KERNELS at its first dot product.
void FirstDotProduct() {
  const DotCase c = MakeCase(GgmlType::kQ8_0, 32, 1);
  float out[kRows];
  VecDotRows(GgmlType::kQ8_0, c.weights.data(), kRows, c.activation.data(), 32, out);
}

TEST(KernelVariantDeathTest, AnUnknownNameIsRefused) {
  ScopedKernelsEnv env("avx1024");
  EXPECT_DEATH(FirstDotProduct(), "MER_CPU_KERNELS=avx1024: not a kernel variant");
}

TEST(KernelVariantDeathTest, AVariantTheCpuLacksIsRefused) {
  for (KernelVariant v : kKernelVariants) {
    if (CpuSupports(v)) continue;
    ScopedKernelsEnv env(KernelVariantName(v));
    EXPECT_DEATH(FirstDotProduct(), "this CPU lacks");
    return;
  }
  GTEST_SKIP() << "this CPU runs every variant";
}

// One block of `type` at `w` against an activation block of alternating +-127: every variant
// within f32 rounding of the double-precision dot product of the dequantized block.
void ExpectNearDequantizedDot(GgmlType type, const void* w) {
  std::vector<float> dequant(256);
  DequantizeRow(type, w, dequant.data(), 256);
  BlockQ8_K a{};
  a.d = 1.0f;
  for (int i = 0; i < 256; ++i) a.qs[i] = static_cast<int8_t>(i % 3 == 0 ? -127 : 127);
  for (int g = 0; g < 16; ++g) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += a.qs[16 * g + i];
    a.bsums[g] = static_cast<int16_t>(s);
  }
  double expect = 0, abs_sum = 0;
  for (int i = 0; i < 256; ++i) {
    expect += double(dequant[i]) * a.qs[i];
    abs_sum += std::fabs(double(dequant[i]) * a.qs[i]);
  }
  for (KernelVariant v : VariantsHere()) {
    float out;
    VecDotRowsWith(v, type, w, 1, &a, 256, &out);
    EXPECT_NEAR(out, expect, 1e-7 * abs_sum) << TypeName(type) << " " << KernelVariantName(v);
  }
}

// Extreme quants, where int16 intermediates would overflow or saturate if a kernel got its
// ranges wrong. The scales are 1, so the exact result is an integer; for Q8_0 and Q4_K every
// partial sum stays below 2^24, so f32 must reproduce it exactly.
TEST(VecDot, ExtremeQuantsAreExact) {
  {
    std::vector<BlockQ8_0> w(8), a(8);
    int64_t expect = 0;
    for (int b = 0; b < 8; ++b) {
      w[b].d = a[b].d = 0x3C00;  // 1.0
      for (int i = 0; i < 32; ++i) {
        w[b].qs[i] = static_cast<int8_t>(i % 3 == 0 ? -128 : 127);  // -128 is legal in files
        a[b].qs[i] = static_cast<int8_t>((i + b) % 2 == 0 ? -127 : 127);
        expect += int64_t{w[b].qs[i]} * a[b].qs[i];
      }
    }
    for (KernelVariant v : VariantsHere()) {
      float out;
      VecDotRowsWith(v, GgmlType::kQ8_0, w.data(), 1, a.data(), 256, &out);
      EXPECT_EQ(out, static_cast<float>(expect)) << KernelVariantName(v);
    }
  }
  {
    BlockQ4_K w{};
    w.d = w.dmin = 0x3C00;
    std::memset(w.scales, 0xFF, sizeof(w.scales));  // every scale and min 63
    std::memset(w.qs, 0xFF, sizeof(w.qs));          // every quant 15
    BlockQ8_K a{};
    a.d = 1.0f;
    for (int i = 0; i < 256; ++i) a.qs[i] = static_cast<int8_t>(i % 4 == 0 ? -127 : 127);
    int64_t expect = 0;
    for (int i = 0; i < 256; ++i) expect += (63 * 15 - 63) * int64_t{a.qs[i]};
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += a.qs[16 * g + i];
      a.bsums[g] = static_cast<int16_t>(s);
    }
    for (KernelVariant v : VariantsHere()) {
      float out;
      VecDotRowsWith(v, GgmlType::kQ4_K, &w, 1, &a, 256, &out);
      EXPECT_EQ(out, static_cast<float>(expect)) << KernelVariantName(v);
    }
  }
  {
    // Every code 31 (or 16 where qh is clear), every scale and min 63: the int16 pair sums are at
    // their largest.
    BlockQ5_K w{};
    w.d = w.dmin = 0x3C00;
    std::memset(w.scales, 0xFF, sizeof(w.scales));
    std::memset(w.qs, 0xFF, sizeof(w.qs));
    for (int l = 0; l < 32; ++l) w.qh[l] = static_cast<uint8_t>(l % 3 == 0 ? 0x0F : 0xFF);
    ExpectNearDequantizedDot(GgmlType::kQ5_K, &w);
  }
  {
    // Q2_K: every code 3, every scale and min 15.
    BlockQ2_K w2{};
    w2.d = w2.dmin = 0x3C00;
    std::memset(w2.scales, 0xFF, sizeof(w2.scales));
    std::memset(w2.qs, 0xFF, sizeof(w2.qs));
    ExpectNearDequantizedDot(GgmlType::kQ2_K, &w2);
    // Q3_K: codes -4 (and 0 where hmask is set), scale codes 0, 48, 15 and 63 (scales -32, 16,
    // -17, 31) for sub-blocks 0-3, 4-7, 8-11 and 12-15.
    BlockQ3_K w3{};
    w3.d = 0x3C00;
    std::memset(w3.scales, 0xF0, 8);
    std::memset(w3.scales + 8, 0xCC, 4);
    for (int l = 0; l < 32; l += 2) w3.hmask[l] = 0x0F;
    ExpectNearDequantizedDot(GgmlType::kQ3_K, &w3);
  }
  {
    // IQ4_XS: every code 0 (-127), scale codes 0, 63, 15, 48 (scales -32, 31, -17, 16) in turn.
    BlockIQ4_XS w{};
    w.d = 0x3C00;
    w.scales_l[0] = w.scales_l[2] = 0xF0;
    w.scales_l[1] = w.scales_l[3] = 0x0F;
    w.scales_h = 0xCCCC;
    ExpectNearDequantizedDot(GgmlType::kIQ4_XS, &w);
  }
  {
    // IQ2_XXS: the last grid point (the largest codes) in every group, scale code 15, signs of
    // sign index 127 (all negative) and 85 in turn.
    BlockIQ2_XXS w{};
    w.d = 0x3C00;
    for (int j = 0; j < 8; ++j) {
      const uint32_t a0 = 0xFFFFFFFF, a1 = 15u << 28 | (j % 2 ? 127u * 0x204081 : 85u * 0x204081);
      std::memcpy(w.qs + 4 * j, &a0, 4);
      std::memcpy(w.qs + 4 * j + 2, &a1, 4);
    }
    ExpectNearDequantizedDot(GgmlType::kIQ2_XXS, &w);
    // IQ3_XXS: the same signs and scale codes, grid point 255 (among the largest codes).
    BlockIQ3_XXS w3{};
    w3.d = 0x3C00;
    std::memset(w3.qs, 0xFF, 64);
    for (int j = 0; j < 8; ++j) {
      const uint32_t word = 15u << 28 | (j % 2 ? 127u * 0x204081 : 85u * 0x204081);
      std::memcpy(w3.qs + 64 + 4 * j, &word, 4);
    }
    ExpectNearDequantizedDot(GgmlType::kIQ3_XXS, &w3);
    // IQ2_XS: grid point 511, sign indices 127 and 85 in turn, scale codes 15 and 0.
    BlockIQ2_XS wx{};
    wx.d = 0x3C00;
    for (int g = 0; g < 32; ++g) wx.qs[g] = static_cast<uint16_t>(511 | (g % 2 ? 127 : 85) << 9);
    std::memset(wx.scales, 0x0F, sizeof(wx.scales));
    ExpectNearDequantizedDot(GgmlType::kIQ2_XS, &wx);
    // IQ3_S: grid point 511 (among the largest codes), every sign set and alternate ones in turn,
    // scale codes 15 and 0.
    BlockIQ3_S ws{};
    ws.d = 0x3C00;
    std::memset(ws.qs, 0xFF, sizeof(ws.qs));
    std::memset(ws.qh, 0xFF, sizeof(ws.qh));
    for (int g = 0; g < 32; ++g) ws.signs[g] = g % 2 ? 0xFF : 0x55;
    std::memset(ws.scales, 0x0F, sizeof(ws.scales));
    ExpectNearDequantizedDot(GgmlType::kIQ3_S, &ws);
    // IQ2_S: grid point 1023, the same signs, scale codes 15 and 0.
    BlockIQ2_S w2s{};
    w2s.d = 0x3C00;
    std::memset(w2s.qs, 0xFF, 32);
    for (int g = 0; g < 32; ++g) w2s.qs[32 + g] = g % 2 ? 0xFF : 0x55;
    std::memset(w2s.qh, 0xFF, sizeof(w2s.qh));
    std::memset(w2s.scales, 0x0F, sizeof(w2s.scales));
    ExpectNearDequantizedDot(GgmlType::kIQ2_S, &w2s);
    // IQ1_S: grid points 0 (all -1) and 2047 (all 1) in turn, scale code 7, both offset signs.
    BlockIQ1_S w1{};
    w1.d = 0x3C00;
    for (int g = 0; g < 32; ++g) w1.qs[g] = g % 2 ? 0xFF : 0x00;
    for (int j = 0; j < 8; ++j) w1.qh[j] = static_cast<uint16_t>(0x7000 | (j % 2 ? 0x8000 : 0) | 0x0E38);
    ExpectNearDequantizedDot(GgmlType::kIQ1_S, &w1);
  }
  {
    // IQ4_NL: every code 0 (-127) or 15 (113) against activations of +-127; the exact integer
    // result stays below 2^24, so f32 reproduces it.
    std::vector<BlockIQ4_NL> w(8);
    std::vector<BlockQ8_0> a(8);
    int64_t expect = 0;
    for (int b = 0; b < 8; ++b) {
      w[b].d = a[b].d = 0x3C00;
      for (int i = 0; i < 16; ++i) w[b].qs[i] = static_cast<uint8_t>(i % 3 == 0 ? 0xF0 : 0x00);
      for (int i = 0; i < 32; ++i) {
        a[b].qs[i] = static_cast<int8_t>((i + b) % 2 == 0 ? -127 : 127);
        const int code = i < 16 ? w[b].qs[i] & 0xF : w[b].qs[i - 16] >> 4;
        expect += int64_t{kIQ4Values[code]} * a[b].qs[i];
      }
    }
    for (KernelVariant v : VariantsHere()) {
      float out;
      VecDotRowsWith(v, GgmlType::kIQ4_NL, w.data(), 1, a.data(), 256, &out);
      EXPECT_EQ(out, static_cast<float>(expect)) << KernelVariantName(v);
    }
  }
  {
    BlockQ6_K w{};
    w.d = 0x3C00;
    for (int j = 0; j < 16; ++j) w.scales[j] = static_cast<int8_t>(j % 2 == 0 ? -128 : 127);
    std::memset(w.ql, 0xFF, sizeof(w.ql));
    std::memset(w.qh, 0xFF, sizeof(w.qh));        // every code 63: q - 32 = 31
    for (int i = 0; i < 64; i += 4) w.qh[i] = 0;  // some codes 15 | 0 << 4 = 15: q - 32 = -17
    ExpectNearDequantizedDot(GgmlType::kQ6_K, &w);
  }
}

TEST(ActivationType, PairsAsGgml) {
  EXPECT_EQ(ActivationTypeFor(GgmlType::kF32), GgmlType::kF32);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kF16), GgmlType::kF16);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kBF16), GgmlType::kBF16);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ8_0), GgmlType::kQ8_0);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ4_0), GgmlType::kQ8_0);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ5_0), GgmlType::kQ8_0);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ4_NL), GgmlType::kQ8_0);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ4_XS), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ2_XXS), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ3_XXS), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ2_XS), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ3_S), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ2_S), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kIQ1_S), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ4_1), GgmlType::kQ8_1);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ5_1), GgmlType::kQ8_1);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ2_K), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ3_K), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ4_K), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ5_K), GgmlType::kQ8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::kQ6_K), GgmlType::kQ8_K);
}

}  // namespace
}  // namespace mer
