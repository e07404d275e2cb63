// Activation quantization (exact bytes against hand-worked vectors) and quantize -> dequantize
// round trips of every type on random data.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/quant/q8_0.h"
#include "common/quant/quant.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

// Block 0 has amax 127, so d = 1 and both quantizers scale by exactly 1: only the rounding of the
// ties differs (ggml's AVX2 path rounds half to even, its reference roundf half away from zero).
// Block 1 is all zero. Block 2 has amax 1: d = f16(1/127) = 0x2008 and the scale is 127.
std::vector<float> Q8_0TestVector() {
  std::vector<float> x(96, 0.0f);
  const float b0[] = {127.0f, 2.5f, -3.5f, 1.2f, -127.0f, 0.5f, -0.5f, 63.5f, 100.49f, -1.5f};
  std::memcpy(x.data(), b0, sizeof(b0));
  const float b2[] = {1.0f, 0.5f, -0.25f, 0.3f, -1.0f};
  std::memcpy(x.data() + 64, b2, sizeof(b2));
  return x;
}

TEST(QuantizeQ8_0, ActivationBytesMatchGgmlX86) {
  const std::vector<float> x = Q8_0TestVector();
  BlockQ8_0 y[3];
  QuantizeRow(GgmlType::kQ8_0, x.data(), y, 96);
  EXPECT_EQ(y[0].d, 0x3C00);
  const int8_t q0[] = {127, 2, -4, 1, -127, 0, 0, 64, 100, -2};
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[0].qs[i], i < 10 ? q0[i] : 0) << i;
  EXPECT_EQ(y[1].d, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[1].qs[i], 0);
  EXPECT_EQ(y[2].d, 0x2008);
  const int8_t q2[] = {127, 64, -32, 38, -127};
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[2].qs[i], i < 5 ? q2[i] : 0) << i;
}

TEST(QuantizeQ8_0, ReferenceBytesRoundHalfAway) {
  const std::vector<float> x = Q8_0TestVector();
  BlockQ8_0 y[3];
  QuantizeRowQ8_0Reference(x.data(), y, 96);
  EXPECT_EQ(y[0].d, 0x3C00);
  const int8_t q0[] = {127, 3, -4, 1, -127, 1, -1, 64, 100, -2};
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[0].qs[i], i < 10 ? q0[i] : 0) << i;
  EXPECT_EQ(y[1].d, 0);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[1].qs[i], 0);
  EXPECT_EQ(y[2].d, 0x2008);
  const int8_t q2[] = {127, 64, -32, 38, -127};  // 1/f32(1/127) is exactly 127 in f32
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[2].qs[i], i < 5 ? q2[i] : 0) << i;
}

// Block 0: the first largest magnitude is x[2] = -2 (x[5] = +2 comes later), so iscale = 63.5:
//   1 -> 63.5 -> 64 (half to even), 0.5 -> 31.75 -> 32, -2 -> -127, 0.2 -> 12.7 -> 13,
//   -1 -> -63.5 -> -64, 2 -> 127; x[16] = -0.03 -> -1.905 -> -2, x[17] = 0.015 -> 0.9525 -> 1,
//   x[31] = 2 -> 127. bsums: 64 + 32 - 127 + 13 - 64 + 127 = 45 and -2 + 1 + 127 = 126.
// Block 1 is all zero. Block 2: max -1 -> iscale 127: -1 -> -127, 0.25 -> 31.75 -> 32.
// Block 3: max +4 (x[10]; x[11] = -4 is later) -> iscale -31.75: 4 -> -127, -4 -> 127,
//   1 -> -31.75 -> -32; d negative.
TEST(QuantizeQ8_K, BytesMatchGgml) {
  std::vector<float> x(1024, 0.0f);
  const float b0[] = {1.0f, 0.5f, -2.0f, 0.2f, -1.0f, 2.0f};
  std::memcpy(x.data(), b0, sizeof(b0));
  x[16] = -0.03f;
  x[17] = 0.015f;
  x[31] = 2.0f;
  x[512] = -1.0f;
  x[513] = 0.25f;
  x[768 + 10] = 4.0f;
  x[768 + 11] = -4.0f;
  x[768 + 12] = 1.0f;

  BlockQ8_K y[4];
  std::memset(y, 0x5A, sizeof(y));  // the zero block must be written in full
  QuantizeRow(GgmlType::kQ8_K, x.data(), y, 1024);

  auto expect_block = [](const BlockQ8_K& b, float d, const std::vector<std::pair<int, int>>& qs,
                         const std::vector<std::pair<int, int>>& bsums) {
    EXPECT_EQ(b.d, d);
    int8_t q[256] = {};
    for (auto [i, v] : qs) q[i] = static_cast<int8_t>(v);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(b.qs[i], q[i]) << i;
    int16_t s[16] = {};
    for (auto [i, v] : bsums) s[i] = static_cast<int16_t>(v);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(b.bsums[i], s[i]) << i;
  };
  expect_block(y[0], 1.0f / 63.5f,
               {{0, 64}, {1, 32}, {2, -127}, {3, 13}, {4, -64}, {5, 127}, {16, -2}, {17, 1}, {31, 127}},
               {{0, 45}, {1, 126}});
  expect_block(y[1], 0.0f, {}, {});
  expect_block(y[2], 1.0f / 127.0f, {{0, -127}, {1, 32}}, {{0, -95}});
  expect_block(y[3], 1.0f / -31.75f, {{10, -127}, {11, 127}, {12, -32}}, {{0, -32}});
}

std::vector<float> RandomRow(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  // Scale varies per 64 elements (as across channels of real tensors), plus some outliers.
  for (int64_t i = 0; i < n; ++i) {
    const float scale = 0.05f + 0.02f * static_cast<float>((i / 64) % 7);
    x[i] = normal(rng) * scale * (i % 97 == 0 ? 6.0f : 1.0f);
  }
  return x;
}

std::vector<float> RoundTrip(GgmlType type, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(RowBytes(type, n));
  QuantizeRow(type, x.data(), q.data(), n);
  std::vector<float> y(n);
  DequantizeRow(type, q.data(), y.data(), n);
  return y;
}

// Root mean square error relative to the root mean square of the data.
double RelativeRmse(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

TEST(RoundTrip, FloatTypes) {
  const std::vector<float> x = RandomRow(4096, 1);
  const std::vector<float> f32 = RoundTrip(GgmlType::kF32, x);
  const std::vector<float> f16 = RoundTrip(GgmlType::kF16, x);
  const std::vector<float> bf16 = RoundTrip(GgmlType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(f32[i], x[i]);
    // Normal f16 results: half an ulp relative; all |x| here are above f16's normal range floor
    // or within one subnormal step of it.
    EXPECT_LE(std::fabs(f16[i] - x[i]), std::fabs(x[i]) * 0x1p-11f + 0x1p-25f) << i;
    EXPECT_LE(std::fabs(bf16[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << i;
  }
}

TEST(RoundTrip, Q8_0WithinHalfAStep) {
  const std::vector<float> x = RandomRow(4096, 2);
  const std::vector<float> y = RoundTrip(GgmlType::kQ8_0, x);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    // Half a quantization step, plus up to 127 times the f16 rounding of d (2^-11 relative).
    const float bound = amax / 127.0f * (0.5f + 127.0f * 0x1p-11f);
    for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(y[32 * b + i] - x[32 * b + i]), bound);
  }
  EXPECT_LT(RelativeRmse(x, y), 0.01);
}

// Q8_1: Q8_0's quants and d, and s = d * sum(q) with the f32 d. Block 2 of the Q8_0 vector has
// amax 1, d = 1/127 and quants 127, 64, -32, 38, -127 (sum 70): s = f16(70 / 127) = 0x3869
// (0.5 * (1 + 105 / 1024)).
TEST(QuantizeQ8_1, QuantsOfQ8_0AndTheirScaledSum) {
  const std::vector<float> x = Q8_0TestVector();
  BlockQ8_0 y0[3];
  BlockQ8_1 y1[3];
  QuantizeRow(GgmlType::kQ8_0, x.data(), y0, 96);
  QuantizeRow(GgmlType::kQ8_1, x.data(), y1, 96);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(y1[b].d, y0[b].d) << b;
    EXPECT_EQ(0, std::memcmp(y1[b].qs, y0[b].qs, 32)) << b;
  }
  EXPECT_EQ(y1[1].s, 0);
  EXPECT_EQ(y1[2].s, 0x3869);
  // Block 0: d = 1, quants 127, 2, -4, 1, -127, 0, 0, 64, 100, -2: sum 161.
  EXPECT_EQ(y1[0].s, F32ToF16(161.0f));
}

TEST(RoundTrip, Q8_KWithinHalfAStep) {
  const std::vector<float> x = RandomRow(4096, 3);
  const std::vector<float> y = RoundTrip(GgmlType::kQ8_K, x);
  for (size_t b = 0; b < x.size() / 256; ++b) {
    float amax = 0;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[256 * b + i]));
    const float bound = amax / 127.0f * 0.5001f;
    for (int i = 0; i < 256; ++i) EXPECT_LE(std::fabs(y[256 * b + i] - x[256 * b + i]), bound);
  }
}

TEST(RoundTrip, QuantizerErrorBounds) {
  const std::vector<float> x = RandomRow(8192, 4);
  // Bounds a little above what the quantizers reach on this Gaussian row (relative to its RMS:
  // q2_k 0.30, q3_k 0.19, q4_k 0.085, q5_k 0.043, q6_k 0.023, q4_0 0.12, q4_1 0.090, q5_0 0.061,
  // q5_1 0.044, iq4_nl 0.093, iq4_xs 0.095, iq2_xxs 0.38, iq2_xs 0.32, iq2_s 0.28, iq3_xxs 0.21,
  // iq3_s 0.16, iq1_s 0.53; ggml's reach about 0.09 for Q4_K, 0.02 for Q6_K).
  const struct {
    GgmlType type;
    double bound;
  } cases[] = {{GgmlType::kQ2_K, 0.32},    {GgmlType::kQ3_K, 0.21},   {GgmlType::kQ4_K, 0.10},
               {GgmlType::kQ5_K, 0.05},    {GgmlType::kQ6_K, 0.025},  {GgmlType::kQ4_0, 0.13},
               {GgmlType::kQ4_1, 0.10},    {GgmlType::kQ5_0, 0.065},  {GgmlType::kQ5_1, 0.05},
               {GgmlType::kIQ4_NL, 0.10},  {GgmlType::kIQ4_XS, 0.10}, {GgmlType::kIQ2_XXS, 0.40},
               {GgmlType::kIQ3_XXS, 0.22}, {GgmlType::kIQ2_XS, 0.34}, {GgmlType::kIQ3_S, 0.17},
               {GgmlType::kIQ2_S, 0.30},   {GgmlType::kIQ1_S, 0.55}};
  for (const auto& c : cases) {
    const double rmse = RelativeRmse(x, RoundTrip(c.type, x));
    EXPECT_LT(rmse, c.bound) << TypeName(c.type);
    std::printf("relative rmse: %-5s %.4f\n", std::string(TypeName(c.type)).c_str(), rmse);
  }
}

// IQ3_S, IQ2_S and IQ1_S on a zero block, a constant one of either sign and one with an outlier:
// zeros stay zeros, the constants keep their sign and come within a quarter of their value, and
// the outlier stays the largest of its block, every value finite.
TEST(RoundTrip, GridTypesOfDegenerateBlocks) {
  std::vector<float> x(1024, 0.0f);                                            // block 0: zeros
  for (int i = 256; i < 512; ++i) x[i] = 0.75f;                                // block 1: constant positive
  for (int i = 512; i < 768; ++i) x[i] = -0.5f;                                // block 2: constant negative
  for (int i = 768; i < 1024; ++i) x[i] = i == 900 ? 50.0f : 0.01f * (i % 5);  // one outlier
  for (GgmlType type : {GgmlType::kIQ3_S, GgmlType::kIQ2_S, GgmlType::kIQ1_S}) {
    const std::vector<float> y = RoundTrip(type, x);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.0f) << TypeName(type) << " " << i;
    for (int i = 256; i < 768; ++i) {
      EXPECT_NEAR(y[i], x[i], 0.25f * std::fabs(x[i])) << TypeName(type) << " " << i;
      EXPECT_GT(y[i] * x[i], 0.0f) << TypeName(type) << " " << i;
    }
    for (int i = 768; i < 1024; ++i) {
      EXPECT_TRUE(std::isfinite(y[i])) << TypeName(type) << " " << i;
      if (i != 900) {
        EXPECT_LT(std::fabs(y[i]), y[900]) << TypeName(type) << " " << i;
      }
    }
    EXPECT_GT(y[900], 25.0f) << TypeName(type);
  }
}

TEST(RoundTrip, KQuantsOfDegenerateBlocks) {
  std::vector<float> x(1024, 0.0f);                                            // block 0: zeros
  for (int i = 256; i < 512; ++i) x[i] = 0.75f;                                // block 1: constant positive
  for (int i = 512; i < 768; ++i) x[i] = -0.5f;                                // block 2: constant negative
  for (int i = 768; i < 1024; ++i) x[i] = i == 900 ? 50.0f : 0.01f * (i % 5);  // one outlier
  for (GgmlType type :
       {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
    const std::vector<float> y = RoundTrip(type, x);
    for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.0f) << TypeName(type) << " " << i;
    for (int i = 256; i < 768; ++i) EXPECT_NEAR(y[i], x[i], 0.02f) << TypeName(type) << " " << i;
    EXPECT_NEAR(y[900], 50.0f, 0.5f) << TypeName(type);
    for (int i = 768; i < 1024; ++i) EXPECT_TRUE(std::isfinite(y[i]));
  }
}

}  // namespace
}  // namespace mer
