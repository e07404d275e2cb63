// F16 and BF16 conversions of common/tensor/half.h: rounding to nearest even, subnormals,
// overflow, infinities and NaN.
#include "common/tensor/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "common/quant/float_dot.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(F16, RoundsToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(1.0f + 0x1p-11f), 0x3C00);             // tie, even is 1.0
  EXPECT_EQ(F32ToF16(1.0f + 3 * 0x1p-11f), 0x3C02);         // tie, even is 1 + 2^-9
  EXPECT_EQ(F32ToF16(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);  // just above the tie
  EXPECT_EQ(F32ToF16(1.0f + 0x1p-11f - 0x1p-23f), 0x3C00);  // just below the tie
  EXPECT_EQ(F32ToF16(-2.5f), 0xC100);
  EXPECT_EQ(F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
}

TEST(F16, OverflowAndInfinity) {
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);    // largest finite
  EXPECT_EQ(F32ToF16(65519.996f), 0x7BFF);  // below the midpoint to 65536
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);    // midpoint: even is 2^16 = inf
  EXPECT_EQ(F32ToF16(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xFC00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_TRUE(std::isinf(F16ToF32(0x7C00)));
  EXPECT_EQ(F16ToF32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0x7BFF), 65504.0f);
}

TEST(F16, Subnormals) {
  EXPECT_EQ(F32ToF16(0x1p-24f), 0x0001);            // smallest subnormal
  EXPECT_EQ(F32ToF16(0x1p-25f), 0x0000);            // tie between 0 and 2^-24: even is 0
  EXPECT_EQ(F32ToF16(0x1p-25f * 1.0001f), 0x0001);  // above the tie
  EXPECT_EQ(F32ToF16(1.5f * 0x1p-24f), 0x0002);     // tie between 1 and 2 ulps: even is 2
  EXPECT_EQ(F32ToF16(2.5f * 0x1p-24f), 0x0002);     // tie between 2 and 3 ulps: even is 2
  EXPECT_EQ(F32ToF16(-3.0f * 0x1p-24f), 0x8003);
  EXPECT_EQ(F32ToF16(1023.0f * 0x1p-24f), 0x03FF);  // largest subnormal
  EXPECT_EQ(F32ToF16(1023.5f * 0x1p-24f), 0x0400);  // tie: rounds up into the normals
  EXPECT_EQ(F32ToF16(0x1p-14f), 0x0400);            // smallest normal
  EXPECT_EQ(F32ToF16(1e-10f), 0x0000);
  EXPECT_EQ(F16ToF32(0x0001), 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x03FF), 1023.0f * 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x8200), -512.0f * 0x1p-24f);
}

TEST(F16, NaN) {
  const f16_bits h = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(h & 0x7C00, 0x7C00);
  EXPECT_NE(h & 0x03FF, 0);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7E00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0xFD01)));
  // A NaN whose payload sits only in the low 13 bits must stay a NaN, not become infinity.
  const f16_bits low = F32ToF16(FromBits(0x7F800001));
  EXPECT_TRUE(std::isnan(F16ToF32(low)));
}

TEST(F16, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<f16_bits>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToF16(f), h) << std::hex << h;
  }
}

TEST(F16, RowConversionsMatchScalar) {
  float x[37];
  for (int i = 0; i < 37; ++i) x[i] = (i - 18) * 0.3371f + (i % 5 == 0 ? 0x1p-25f : 0.0f);
  f16_bits h[37];
  ConvertF32ToF16(x, h, 37);
  float back[37];
  ConvertF16ToF32(h, back, 37);
  for (int i = 0; i < 37; ++i) {
    EXPECT_EQ(h[i], F32ToF16(x[i]));
    EXPECT_EQ(back[i], F16ToF32(h[i]));
  }
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3F80);
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f), 0x3F80);             // tie, even is 1.0
  EXPECT_EQ(F32ToBF16(1.0f + 3 * 0x1p-8f), 0x3F82);         // tie, even is 1 + 2^-6
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // above the tie
  EXPECT_EQ(F32ToBF16(-3.0f), 0xC040);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000);
  EXPECT_EQ(BF16ToF32(0x3F81), 1.0f + 0x1p-7f);
}

TEST(BF16, SubnormalsOverflowInfNaN) {
  EXPECT_EQ(F32ToBF16(FromBits(0x00000001)), 0x0000);  // below half the smallest bf16 subnormal
  EXPECT_EQ(F32ToBF16(FromBits(0x00008000)), 0x0000);  // tie, even is 0
  EXPECT_EQ(F32ToBF16(FromBits(0x00018000)), 0x0002);  // tie, even is 2
  EXPECT_EQ(F32ToBF16(FromBits(0x00010000)), 0x0001);  // smallest bf16 subnormal, exact
  EXPECT_EQ(BF16ToF32(0x0001), FromBits(0x00010000));
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // NaNs stay NaNs (quiet bit set), even with the payload only in the dropped low bits.
  EXPECT_EQ(F32ToBF16(FromBits(0x7F800001)), 0x7FC0);
  EXPECT_EQ(F32ToBF16(FromBits(0xFFC00000)), 0xFFC0);
  EXPECT_TRUE(std::isnan(BF16ToF32(0x7FC0)));
}

TEST(BF16, RowConversionsMatchScalar) {
  uint32_t bits[] = {0x3F808000, 0x3F818000, 0x7F800001, 0xFF800000, 0x00018000, 0x7F7FFFFF,
                     0x80000000, 0x3F800001, 0x40490FDB, 0xC2F6E979, 0x00000001, 0x7FC00000,
                     0x3EAAAAAB, 0x3F7FFFFF, 0x47800000, 0x12345678, 0x89ABCDEF};
  constexpr int kN = sizeof(bits) / sizeof(bits[0]);
  float x[kN];
  for (int i = 0; i < kN; ++i) x[i] = FromBits(bits[i]);
  bf16_bits h[kN];
  ConvertF32ToBF16(x, h, kN);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(h[i], F32ToBF16(x[i])) << std::hex << bits[i];
  float back[kN];
  ConvertBF16ToF32(h, back, kN);
  for (int i = 0; i < kN; ++i) EXPECT_EQ(ToBits(back[i]), uint32_t{h[i]} << 16);
}

}  // namespace
}  // namespace mer
