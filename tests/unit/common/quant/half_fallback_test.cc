// The portable (non-F16C) F16 conversions of half.h against the F16C instructions, which define
// the rounding ggml's x86 backend uses. This file is compiled with -mno-f16c, and half.h is
// included inside a namespace of its own so that its portable inline functions do not collide
// (ODR) with the F16C ones every other file gets.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace portable {
#include "common/tensor/half.h"
}  // namespace portable

namespace {

// The hardware conversions, called through functions compiled for F16C.
__attribute__((target("f16c"))) uint16_t HardwareF32ToF16(float f) { return _cvtss_sh(f, 0); }
__attribute__((target("f16c"))) float HardwareF16ToF32(uint16_t h) { return _cvtsh_ss(h); }

// Whether portable:: holds the portable code (-mno-f16c took effect) and the host can run F16C
// (GCC's __builtin_cpu_supports knows no "f16c"; every AVX2 CPU has it).
bool CanCompare() {
#if defined(__F16C__)
  return false;
#else
  return __builtin_cpu_supports("avx2");
#endif
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(F16Portable, EveryHalfWidensLikeF16c) {
  if (!CanCompare()) GTEST_SKIP();
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float want = HardwareF16ToF32(static_cast<uint16_t>(h));
    const float got = portable::mer::F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << std::hex << h;
      continue;
    }
    uint32_t a, b;
    std::memcpy(&a, &want, 4);
    std::memcpy(&b, &got, 4);
    ASSERT_EQ(a, b) << std::hex << h;
  }
}

// All floats whose f16 rounding involves subnormals or the normal/subnormal boundary (every
// mantissa of exponents 2^-26 .. 2^-14), and for the rest of the range every exponent with the
// mantissa patterns around the rounding point: exact, tie, just above and below it, odd and even.
TEST(F16Portable, NarrowsLikeF16c) {
  if (!CanCompare()) GTEST_SKIP();
  // Plain comparisons (no gtest assertion per value: there are ~10^8 of them); stops at the
  // first mismatch.
  auto check = [](uint32_t bits) {
    const float f = FromBits(bits);
    const uint16_t want = HardwareF32ToF16(f);
    const uint16_t got = portable::mer::F32ToF16(f);
    // NaN payloads may differ; both must be NaNs.
    const bool ok = std::isnan(f) ? (got & 0x7C00) == 0x7C00 && (got & 0x03FF) != 0 : got == want;
    if (!ok) ADD_FAILURE() << std::hex << "f32 bits 0x" << bits << ": got 0x" << got << ", F16C 0x" << want;
    return ok;
  };
  for (uint32_t e = 127 - 26; e <= 127 - 14; ++e) {
    for (uint32_t m = 0; m < (1u << 23); m += 1) {
      if (!check((e << 23) | m)) return;
    }
  }
  const uint32_t low_patterns[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x0800, 0x1800};
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t high = 0; high < (1u << 18); ++high) {  // exponent and top 10 mantissa bits
      for (uint32_t low : low_patterns) {
        if (!check((sign << 31) | (high << 13) | low)) return;
      }
    }
  }
}

}  // namespace
