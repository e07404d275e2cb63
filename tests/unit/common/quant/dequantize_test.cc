// Dequantization of hand-built blocks, checked against values worked out from the format
// definitions (blocks.h) independently of the library's decoding.
#include <cstring>
#include <vector>

#include "common/quant/iq1.h"
#include "common/quant/iq2.h"
#include "common/quant/iq3.h"
#include "common/quant/quant.h"
#include "gtest/gtest.h"

namespace mer {
namespace {

TEST(DequantizeQ8_0, HandBuiltBlocks) {
  BlockQ8_0 blocks[2];
  blocks[0].d = 0x3800;                                                             // 0.5
  for (int i = 0; i < 32; ++i) blocks[0].qs[i] = static_cast<int8_t>(i * 8 - 128);  // -128 .. 120
  blocks[1].d = 0xC400;                                                             // -4.0
  for (int i = 0; i < 32; ++i) blocks[1].qs[i] = static_cast<int8_t>(i % 2 == 0 ? 127 : -i);
  float out[64];
  DequantizeRow(GgmlType::kQ8_0, blocks, out, 64);
  EXPECT_EQ(out[0], -64.0f);
  EXPECT_EQ(out[1], -60.0f);
  EXPECT_EQ(out[16], 0.0f);
  EXPECT_EQ(out[31], 60.0f);
  EXPECT_EQ(out[32], -508.0f);
  EXPECT_EQ(out[33], 4.0f);
  EXPECT_EQ(out[63], 124.0f);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(out[i], 0.5f * (i * 8 - 128));
    EXPECT_EQ(out[32 + i], -4.0f * (i % 2 == 0 ? 127 : -i));
  }
}

// The 32-element formats with qs[i] = 16 i + (15 - i) (low nibble 15 - i, high nibble i) and
// qh = 0xA5C3F00F: element j < 16 has code (15 - j) | bit j << 4, element 16 + j code
// j | bit (16 + j) << 4 (5-bit formats), d = 0.5, m = -3.
TEST(DequantizeLegacy, HandBuiltBlocks) {
  uint8_t qs[16];
  for (int i = 0; i < 16; ++i) qs[i] = static_cast<uint8_t>(16 * i + (15 - i));
  const uint32_t qh = 0xA5C3F00F;
  const auto code4 = [](int e) { return e < 16 ? 15 - e : e - 16; };
  const auto code5 = [&](int e) { return code4(e) | static_cast<int>(((qh >> e) & 1) << 4); };
  BlockQ4_0 q4_0;
  BlockQ4_1 q4_1;
  BlockQ5_0 q5_0;
  BlockQ5_1 q5_1;
  q4_0.d = q4_1.d = q5_0.d = q5_1.d = 0x3800;  // 0.5
  q4_1.m = q5_1.m = 0xC200;                    // -3
  std::memcpy(q4_0.qs, qs, 16);
  std::memcpy(q4_1.qs, qs, 16);
  std::memcpy(q5_0.qs, qs, 16);
  std::memcpy(q5_1.qs, qs, 16);
  std::memcpy(q5_0.qh, &qh, 4);
  std::memcpy(q5_1.qh, &qh, 4);
  float out[4][32];
  DequantizeRow(GgmlType::kQ4_0, &q4_0, out[0], 32);
  DequantizeRow(GgmlType::kQ4_1, &q4_1, out[1], 32);
  DequantizeRow(GgmlType::kQ5_0, &q5_0, out[2], 32);
  DequantizeRow(GgmlType::kQ5_1, &q5_1, out[3], 32);
  for (int e = 0; e < 32; ++e) {
    EXPECT_EQ(out[0][e], 0.5f * (code4(e) - 8)) << e;
    EXPECT_EQ(out[1][e], 0.5f * code4(e) - 3.0f) << e;
    EXPECT_EQ(out[2][e], 0.5f * (code5(e) - 16)) << e;
    EXPECT_EQ(out[3][e], 0.5f * code5(e) - 3.0f) << e;
  }
  EXPECT_EQ(out[0][0], 3.5f);   // code 15: 0.5 * (15 - 8)
  EXPECT_EQ(out[1][31], 4.5f);  // code 15: 0.5 * 15 - 3
  EXPECT_EQ(out[2][4], -2.5f);  // code 11, qh bit 4 clear: 0.5 * (11 - 16)
  EXPECT_EQ(out[3][16], 5.0f);  // code 0 | 16 (qh bit 16 set): 0.5 * 16 - 3
  EXPECT_EQ(out[2][31], 7.5f);  // code 15 | 16 (qh bit 31 set): 0.5 * (31 - 16)
}

// IQ4_NL with qs[i] = 16 i + (15 - i) and d = 0.5: element j < 16 is 0.5 * value[15 - j],
// element 16 + j 0.5 * value[j]. IQ4_XS with the same codes in every sub-block and hand-packed
// scale codes {0, 63, 31, 32, 1, 40, 17, 48} (scales_l nibbles, scales_h bit pairs), d = 0.25.
TEST(DequantizeIQ4, HandBuiltBlocks) {
  constexpr int kValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  const auto code = [](int e) { return e < 16 ? 15 - e : e - 16; };
  BlockIQ4_NL nl;
  nl.d = 0x3800;  // 0.5
  for (int i = 0; i < 16; ++i) nl.qs[i] = static_cast<uint8_t>(16 * i + (15 - i));
  float out_nl[32];
  DequantizeRow(GgmlType::kIQ4_NL, &nl, out_nl, 32);
  for (int e = 0; e < 32; ++e) EXPECT_EQ(out_nl[e], 0.5f * kValues[code(e)]) << e;
  EXPECT_EQ(out_nl[0], 56.5f);    // value[15] = 113
  EXPECT_EQ(out_nl[16], -63.5f);  // value[0] = -127

  constexpr int kCodes[8] = {0, 63, 31, 32, 1, 40, 17, 48};
  BlockIQ4_XS xs;
  xs.d = 0x3400;          // 0.25
  xs.scales_l[0] = 0xF0;  // codes 0, 63: low nibbles 0x0, 0xF
  xs.scales_l[1] = 0x0F;  // 31, 32: 0xF, 0x0
  xs.scales_l[2] = 0x81;  // 1, 40: 0x1, 0x8
  xs.scales_l[3] = 0x01;  // 17, 48: 0x1, 0x0
  // High bit pairs 0, 3, 1, 2, 0, 2, 1, 3 for sub-blocks 0..7.
  xs.scales_h = static_cast<uint16_t>(0 | 3 << 2 | 1 << 4 | 2 << 6 | 0 << 8 | 2 << 10 | 1 << 12 | 3 << 14);
  for (int j = 0; j < 8; ++j) {
    std::memcpy(xs.qs + 16 * j, nl.qs, 16);
    EXPECT_EQ(IQ4_XSScale(xs, j), kCodes[j]) << j;
  }
  float out_xs[256];
  DequantizeRow(GgmlType::kIQ4_XS, &xs, out_xs, 256);
  for (int e = 0; e < 256; ++e) EXPECT_EQ(out_xs[e], 0.25f * (kCodes[e / 32] - 32) * kValues[code(e % 32)]) << e;
  EXPECT_EQ(out_xs[32], 875.75f);    // sub-block 1 (scale 31), value 113: 0.25 * 31 * 113
  EXPECT_EQ(out_xs[96 + 16], 0.0f);  // sub-block 3 (scale 0)
}

// IQ2_XXS with d = 0.5: sub-block j's groups on grid points 37 j + 11 l (l the group), scale code
// j, and sign indices 9 j + 5 l + 1, whose 8th sign is the parity of the 7 given. Element i of
// group l is d * (0.5 + j) / 4 * (byte i of the grid point) * sign i.
TEST(DequantizeIQ2_XXS, HandBuiltBlock) {
  BlockIQ2_XXS block;
  block.d = 0x3800;  // 0.5
  for (int j = 0; j < 8; ++j) {
    uint32_t a0 = 0, a1 = static_cast<uint32_t>(j) << 28;
    for (int l = 0; l < 4; ++l) {
      a0 |= static_cast<uint32_t>((37 * j + 11 * l) % 256) << (8 * l);
      a1 |= static_cast<uint32_t>(9 * j + 5 * l + 1) << (7 * l);
    }
    std::memcpy(block.qs + 4 * j, &a0, 4);
    std::memcpy(block.qs + 4 * j + 2, &a1, 4);
  }
  float out[256];
  DequantizeRow(GgmlType::kIQ2_XXS, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = (e % 32) / 8, i = e % 8;
    const int grid = static_cast<int>((kIQ2_XXSGrid[(37 * j + 11 * l) % 256] >> (8 * i)) & 0xFF);
    const int signs7 = 9 * j + 5 * l + 1;
    int parity = 0;
    for (int b = 0; b < 7; ++b) parity ^= (signs7 >> b) & 1;
    const bool negative = i < 7 ? (signs7 >> i) & 1 : parity;
    EXPECT_EQ(out[e], 0.5f * (0.5f + j) * 0.25f * grid * (negative ? -1.0f : 1.0f)) << e;
  }
  // Element 0: grid point 0 (all codes 8), sign index 1 (element 0 negative): -0.5 * 0.5 / 4 * 8.
  EXPECT_EQ(out[0], -0.5f);
  // Element 7 of group 0: sign index 1 has one negative, so the 8th sign (parity) is negative too.
  EXPECT_LT(out[7], 0.0f);
}

// IQ2_XS with d = 0.5: group g (of 32) on grid point 17 g + 3 (mod 512) with sign index 11 g + 2
// (mod 128),
// scales[j] = 0x3A + j: element i of group g is d * (0.5 + ls) / 4 * (byte i of the point) * sign
// i, ls the low nibble of scales[g / 4] for g % 4 < 2, else the high one.
TEST(DequantizeIQ2_XS, HandBuiltBlock) {
  BlockIQ2_XS block;
  block.d = 0x3800;  // 0.5
  for (int g = 0; g < 32; ++g) block.qs[g] = static_cast<uint16_t>((17 * g + 3) % 512 | ((11 * g + 2) % 128) << 9);
  for (int j = 0; j < 8; ++j) block.scales[j] = static_cast<uint8_t>(0x3A + j);
  float out[256];
  DequantizeRow(GgmlType::kIQ2_XS, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 8, i = e % 8;
    const int ls = g % 4 < 2 ? (0x3A + g / 4) & 0xF : (0x3A + g / 4) >> 4;
    const int grid = static_cast<int>((kIQ2_XSGrid[(17 * g + 3) % 512] >> (8 * i)) & 0xFF);
    const int signs7 = (11 * g + 2) % 128;
    int parity = 0;
    for (int b = 0; b < 7; ++b) parity ^= (signs7 >> b) & 1;
    const bool negative = i < 7 ? (signs7 >> i) & 1 : parity;
    EXPECT_EQ(out[e], 0.5f * (0.5f + ls) * 0.25f * grid * (negative ? -1.0f : 1.0f)) << e;
  }
}

// IQ3_XXS with d = 0.5: sub-block j's grid indices qs[8j + k] = 29 j + 13 k, its word holding
// scale code 15 - j and sign indices 9 j + 5 l + 1 for groups l. Element i of group l is
// d * (0.5 + ls) / 2 * (byte i % 4 of grid point qs[8j + 2l + i / 4]) * sign i.
TEST(DequantizeIQ3_XXS, HandBuiltBlock) {
  BlockIQ3_XXS block;
  block.d = 0x3800;  // 0.5
  for (int j = 0; j < 8; ++j) {
    for (int k = 0; k < 8; ++k) block.qs[8 * j + k] = static_cast<uint8_t>((29 * j + 13 * k) % 256);
    uint32_t word = static_cast<uint32_t>(15 - j) << 28;
    for (int l = 0; l < 4; ++l) word |= static_cast<uint32_t>(9 * j + 5 * l + 1) << (7 * l);
    std::memcpy(block.qs + 64 + 4 * j, &word, 4);
  }
  float out[256];
  DequantizeRow(GgmlType::kIQ3_XXS, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, l = (e % 32) / 8, i = e % 8;
    const int point = (29 * j + 13 * (2 * l + i / 4)) % 256;
    const int grid = static_cast<int>((kIQ3_XXSGrid[point] >> (8 * (i % 4))) & 0xFF);
    const int signs7 = 9 * j + 5 * l + 1;
    int parity = 0;
    for (int b = 0; b < 7; ++b) parity ^= (signs7 >> b) & 1;
    const bool negative = i < 7 ? (signs7 >> i) & 1 : parity;
    EXPECT_EQ(out[e], 0.5f * (0.5f + (15 - j)) * 0.5f * grid * (negative ? -1.0f : 1.0f)) << e;
  }
  // Element 0: grid point 0 (all codes 4), scale code 15, sign index 1: -0.5 * 15.5 / 2 * 4.
  EXPECT_EQ(out[0], -15.5f);
}

// IQ3_S with d = 0.5: qs[k] = 37 k + 5, qh[j] = 0x5A ^ 29 j, signs[g] = 53 g + 7 (mod 256),
// scales[i] = 0x1F + 0x23 i. Element e of sub-block j is d * (1 + 2 ls) * (byte e % 4 of grid point
// qs[8j + k] | (bit k of qh[j]) << 8, k = e / 4) * sign, ls the low (j even) or high (j odd) nibble
// of scales[j / 2], the sign bit e % 8 of signs[4j + e / 8].
TEST(DequantizeIQ3_S, HandBuiltBlock) {
  BlockIQ3_S block;
  block.d = 0x3800;  // 0.5
  for (int k = 0; k < 64; ++k) block.qs[k] = static_cast<uint8_t>((37 * k + 5) % 256);
  for (int j = 0; j < 8; ++j) block.qh[j] = static_cast<uint8_t>(0x5A ^ (29 * j % 256));
  for (int g = 0; g < 32; ++g) block.signs[g] = static_cast<uint8_t>((53 * g + 7) % 256);
  for (int i = 0; i < 4; ++i) block.scales[i] = static_cast<uint8_t>(0x1F + 0x23 * i);
  float out[256];
  DequantizeRow(GgmlType::kIQ3_S, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32, k = (e % 32) / 4;
    const int point = block.qs[8 * j + k] | ((block.qh[j] >> k) & 1) << 8;
    const int grid = static_cast<int>((kIQ3_SGrid[point] >> (8 * (e % 4))) & 0xFF);
    const int ls = (block.scales[j / 2] >> (4 * (j % 2))) & 0xF;
    const bool negative = (block.signs[e / 8] >> (e % 8)) & 1;
    EXPECT_EQ(out[e], 0.5f * (1 + 2 * ls) * grid * (negative ? -1.0f : 1.0f)) << e;
  }
  // Element 0: grid point 5 (0x01010301, code 1), ls 15, sign bit 0 of 7 set: -0.5 * 31 * 1.
  EXPECT_EQ(out[0], -15.5f);
  // Element 4: bit 1 of qh[0] = 0x5A set, so grid point 256 + 42 (0x0703010b, code 11), positive.
  EXPECT_EQ(out[4], 170.5f);
}

// IQ2_S with d = 0.5: group g (of 32) has qs[g] = 29 g + 3 and sign byte qs[32 + g] = 71 g + 13
// (mod 256); qh[j] = 0xB4 + 37 j (mod 256), scales[j] = 0x3A + j. Element i of group g = 4j + l is
// d * (0.5 + ls) / 4 * (byte i of grid point qs[g] | (bits 2l, 2l + 1 of qh[j]) << 8) * sign,
// ls the low nibble of scales[j] for l < 2, else the high one.
TEST(DequantizeIQ2_S, HandBuiltBlock) {
  BlockIQ2_S block;
  block.d = 0x3800;  // 0.5
  for (int g = 0; g < 32; ++g) {
    block.qs[g] = static_cast<uint8_t>((29 * g + 3) % 256);
    block.qs[32 + g] = static_cast<uint8_t>((71 * g + 13) % 256);
  }
  for (int j = 0; j < 8; ++j) {
    block.qh[j] = static_cast<uint8_t>((0xB4 + 37 * j) % 256);
    block.scales[j] = static_cast<uint8_t>(0x3A + j);
  }
  float out[256];
  DequantizeRow(GgmlType::kIQ2_S, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 8, i = e % 8, j = g / 4, l = g % 4;
    const int point = block.qs[g] | ((block.qh[j] >> (2 * l)) & 3) << 8;
    const int grid = static_cast<int>((kIQ2_SGrid[point] >> (8 * i)) & 0xFF);
    const int ls = l < 2 ? block.scales[j] & 0xF : block.scales[j] >> 4;
    const bool negative = (block.qs[32 + g] >> i) & 1;
    EXPECT_EQ(out[e], 0.5f * (0.5f + ls) * 0.25f * grid * (negative ? -1.0f : 1.0f)) << e;
  }
  // Element 0: grid point 3 (code 8), ls 10, sign bit 0 of 13 set: -0.5 * 10.5 / 4 * 8.
  EXPECT_EQ(out[0], -10.5f);
  // Elements 16, 17 (group 2): bits 4, 5 of qh[0] = 0xB4 both set, so grid point 768 + 61
  // (codes 8, 25), ls 3, sign bits 0 and 1 of 155 set.
  EXPECT_EQ(out[16], -3.5f);
  EXPECT_EQ(out[17], -10.9375f);
}

// IQ1_S with d = 0.5: group g (of 32) has qs[g] = 13 g + 200 (mod 256); qh[j] holds 0x2493 j +
// 0x1000 in bits 0-14 and bit 15 set for odd j. Element i of group g = 4j + l is
// d * (2 ls + 1) * (value i of grid point qs[g] | (bits 3l .. 3l + 2 of qh[j]) << 8 + delta),
// ls bits 12-14 of qh[j], delta -1/8 where bit 15 is set, else 1/8.
TEST(DequantizeIQ1_S, HandBuiltBlock) {
  BlockIQ1_S block;
  block.d = 0x3800;  // 0.5
  for (int g = 0; g < 32; ++g) block.qs[g] = static_cast<uint8_t>((13 * g + 200) % 256);
  for (int j = 0; j < 8; ++j) block.qh[j] = static_cast<uint16_t>(((0x2493 * j + 0x1000) & 0x7FFF) | (j % 2) << 15);
  float out[256];
  DequantizeRow(GgmlType::kIQ1_S, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int g = e / 8, i = e % 8, j = g / 4, l = g % 4;
    const int point = block.qs[g] | ((block.qh[j] >> (3 * l)) & 7) << 8;
    const int value = static_cast<int8_t>((kIQ1_SGrid[point] >> (8 * i)) & 0xFF);
    const int ls = (block.qh[j] >> 12) & 7;
    const float delta = j % 2 ? -0.125f : 0.125f;
    EXPECT_EQ(out[e], 0.5f * (2 * ls + 1) * (value + delta)) << e;
  }
  // Elements 0, 1: grid point 200 (values -1, 0), ls 1, delta 1/8: 1.5 * (-7/8) and 1.5 / 8.
  EXPECT_EQ(out[0], -1.3125f);
  EXPECT_EQ(out[1], 0.1875f);
}

// Q4_K with scales sc = {1, 2, 3, 63, 17, 33, 48, 63} and mins m = {0, 5, 40, 63, 9, 20, 36, 62},
// packed by hand:
//   bytes 0..3  = sc[0..3] | (sc[4..7] >> 4) << 6 = 0x41 0x82 0xC3 0xFF
//   bytes 4..7  = m[0..3]  | (m[4..7] >> 4) << 6  = 0x00 0x45 0xA8 0xFF
//   bytes 8..11 = (sc[4..7] & 15) | (m[4..7] & 15) << 4 = 0x91 0x41 0x40 0xEF
// d = 0.5, dmin = 0.25; the low nibble of qs byte i is i % 16, the high one 15 - i % 16. Q5_K's
// block is the same with its fifth bits added.
constexpr int kSc[8] = {1, 2, 3, 63, 17, 33, 48, 63};
constexpr int kMin[8] = {0, 5, 40, 63, 9, 20, 36, 62};

template <typename Block>
Block HandBuiltScaleMinBlock() {
  Block block;
  block.d = 0x3800;     // 0.5
  block.dmin = 0x3400;  // 0.25
  const uint8_t scales[12] = {0x41, 0x82, 0xC3, 0xFF, 0x00, 0x45, 0xA8, 0xFF, 0x91, 0x41, 0x40, 0xEF};
  std::memcpy(block.scales, scales, 12);
  for (int i = 0; i < 128; ++i) block.qs[i] = static_cast<uint8_t>((i % 16) | ((15 - i % 16) << 4));
  return block;
}

TEST(DequantizeQ4_K, HandBuiltBlockWithAllEightScalesAndMins) {
  const BlockQ4_K block = HandBuiltScaleMinBlock<BlockQ4_K>();

  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    Q4_KScaleMin(block.scales, j, &sc, &m);
    EXPECT_EQ(sc, kSc[j]) << j;
    EXPECT_EQ(m, kMin[j]) << j;
  }

  float out[256];
  DequantizeRow(GgmlType::kQ4_K, &block, out, 256);
  // Element e lies in chunk e / 64; its first 32 elements are low nibbles of sub-block
  // 2 * chunk, the next 32 high nibbles of sub-block 2 * chunk + 1.
  for (int e = 0; e < 256; ++e) {
    const int r = e % 64, sub = e / 32;
    const int q = r < 32 ? r % 16 : 15 - (r - 32) % 16;
    EXPECT_EQ(out[e], 0.5f * kSc[sub] * q - 0.25f * kMin[sub]) << e;
  }
  EXPECT_EQ(out[0], 0.0f);       // sub 0, q 0: 0.5*1*0 - 0.25*0
  EXPECT_EQ(out[45], 0.75f);     // sub 1, q 15-13=2: 0.5*2*2 - 0.25*5
  EXPECT_EQ(out[100], 330.75f);  // sub 3, q 11: 0.5*63*11 - 0.25*63
  EXPECT_EQ(out[200], 183.0f);   // sub 6, q 8: 0.5*48*8 - 0.25*36
  EXPECT_EQ(out[255], -15.5f);   // sub 7, q 0: -0.25*62
}

// Q5_K: the Q4_K block above (same scales and mins, same nibbles) with qh[l] = 0x5A ^ l: element
// 64c + l gets bit 2c of qh[l] as its fifth bit, element 64c + 32 + l bit 2c + 1.
TEST(DequantizeQ5_K, HandBuiltBlockWithFifthBits) {
  BlockQ5_K block = HandBuiltScaleMinBlock<BlockQ5_K>();
  for (int l = 0; l < 32; ++l) block.qh[l] = static_cast<uint8_t>(0x5A ^ l);

  float out[256];
  DequantizeRow(GgmlType::kQ5_K, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int c = e / 64, r = e % 64, sub = e / 32, l = e % 32;
    const int low = r < 32 ? r % 16 : 15 - (r - 32) % 16;
    const int bit = (block.qh[l] >> (2 * c + (r >= 32 ? 1 : 0))) & 1;
    EXPECT_EQ(out[e], 0.5f * kSc[sub] * (low + 16 * bit) - 0.25f * kMin[sub]) << e;
  }
  EXPECT_EQ(out[0], 0.0f);       // sub 0, low 0, qh[0] = 0x5A bit 0 = 0
  EXPECT_EQ(out[33], 28.75f);    // sub 1, low 14, qh[1] = 0x5B bit 1 = 1: 0.5*2*30 - 0.25*5
  EXPECT_EQ(out[70], 23.0f);     // sub 2, low 6, qh[6] = 0x5C bit 2 = 1: 0.5*3*22 - 0.25*40
  EXPECT_EQ(out[140], 235.75f);  // sub 4, low 12, qh[12] = 0x56 bit 4 = 1: 0.5*17*28 - 0.25*9
  EXPECT_EQ(out[255], -15.5f);   // sub 7, low 0, qh[31] = 0x45 bit 7 = 0: -0.25*62
}

// Q2_K with sub-block j's scale j and min 15 - j, qs[i] = 37 i mod 256, d = 0.5, dmin = 0.25.
// Element 128h + 32s + l is bits 2s, 2s + 1 of qs[32h + l], in sub-block 8h + 2s + l / 16.
TEST(DequantizeQ2_K, HandBuiltBlock) {
  BlockQ2_K block;
  for (int j = 0; j < 16; ++j) block.scales[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  for (int i = 0; i < 64; ++i) block.qs[i] = static_cast<uint8_t>((37 * i) & 0xFF);
  block.d = 0x3800;     // 0.5
  block.dmin = 0x3400;  // 0.25
  float out[256];
  DequantizeRow(GgmlType::kQ2_K, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32, sub = 8 * h + 2 * s + l / 16;
    const int q = (block.qs[32 * h + l] >> (2 * s)) & 3;
    EXPECT_EQ(out[e], 0.5f * sub * q - 0.25f * (15 - sub)) << e;
  }
  EXPECT_EQ(out[0], -3.75f);   // sub 0, q 0: -0.25*15
  EXPECT_EQ(out[17], -3.0f);   // sub 1, qs[17] = 0x75 bits 0,1 = 1: 0.5*1*1 - 0.25*14
  EXPECT_EQ(out[100], 3.75f);  // sub 6, qs[4] = 0x94 bits 6,7 = 2: 0.5*6*2 - 0.25*9
  EXPECT_EQ(out[130], 6.25f);  // sub 8, qs[34] = 0xEA bits 0,1 = 2: 0.5*8*2 - 0.25*7
  EXPECT_EQ(out[255], 0.0f);   // sub 15, qs[63] = 0x1B bits 6,7 = 0: 0.5*15*0 - 0.25*0
}

// Q3_K with hand-packed 6-bit scale codes {15, 62, 61, 12, 27, 42, 9, 56, 33, 18, 19, 36, 53, 6,
// 39, 24}: code j's low nibble is the low (j < 8) or high (j >= 8) nibble of scales[j % 8], its
// bits 4, 5 are bits 2 (j / 4), 2 (j / 4) + 1 of scales[8 + j % 4]. qs[i] = 11 i + 5, hmask[l] =
// 29 l + 3 (mod 256), d = 0.5: element 128h + 32s + l is (bits 2s, 2s + 1 of qs[32h + l]) - 4
// unless bit 4h + s of hmask[l] is set, times 0.5 (code - 32).
TEST(DequantizeQ3_K, HandBuiltBlock) {
  constexpr int kCodes[16] = {15, 62, 61, 12, 27, 42, 9, 56, 33, 18, 19, 36, 53, 6, 39, 24};
  BlockQ3_K block;
  const uint8_t scales[12] = {0x1F, 0x2E, 0x3D, 0x4C, 0x5B, 0x6A, 0x79, 0x88, 0xE4, 0x1B, 0x93, 0x6C};
  std::memcpy(block.scales, scales, 12);
  for (int i = 0; i < 64; ++i) block.qs[i] = static_cast<uint8_t>((11 * i + 5) & 0xFF);
  for (int l = 0; l < 32; ++l) block.hmask[l] = static_cast<uint8_t>((29 * l + 3) & 0xFF);
  block.d = 0x3800;  // 0.5
  for (int j = 0; j < 16; ++j) EXPECT_EQ(Q3_KScale(block.scales, j), kCodes[j]) << j;
  float out[256];
  DequantizeRow(GgmlType::kQ3_K, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const int low = (block.qs[32 * h + l] >> (2 * s)) & 3;
    const int q = (block.hmask[l] >> (4 * h + s)) & 1 ? low : low - 4;
    EXPECT_EQ(out[e], 0.5f * (kCodes[e / 16] - 32) * q) << e;
  }
  EXPECT_EQ(out[0], -8.5f);   // code 15, qs[0] = 5 -> 1, hmask[0] = 3 bit 0 set: q 1
  EXPECT_EQ(out[40], 43.5f);  // code 61, qs[8] = 93 -> bits 2,3 = 3, hmask[8] bit 1 set: q 3
  EXPECT_EQ(out[150], 7.0f);  // code 18, qs[54] bits 0,1 = 3, hmask[22] bit 4 clear: q -1
}

// Q6_K with ql[i] = i, qh[i] = (37 * i) mod 256, d = 0.5 and signed scales.
TEST(DequantizeQ6_K, HandBuiltBlock) {
  constexpr int8_t kScales[16] = {1, -2, 3, -4, 5, -6, 7, -8, 127, -128, 10, -10, 20, -20, 30, -30};
  BlockQ6_K block;
  for (int i = 0; i < 128; ++i) block.ql[i] = static_cast<uint8_t>(i);
  for (int i = 0; i < 64; ++i) block.qh[i] = static_cast<uint8_t>((37 * i) & 0xFF);
  std::memcpy(block.scales, kScales, 16);
  block.d = 0x3800;  // 0.5

  float out[256];
  DequantizeRow(GgmlType::kQ6_K, &block, out, 256);
  for (int e = 0; e < 256; ++e) {
    const int half = e / 128, group = (e % 128) / 32, l = e % 32;
    // Groups 0 and 2 use ql[l], groups 1 and 3 ql[l + 32]; groups 0, 1 the low nibble, 2, 3 the
    // high; qh[l] contributes bits 2*group and 2*group+1 as the code's bits 4 and 5.
    const int ql = block.ql[64 * half + l + (group % 2) * 32];
    const int low = group < 2 ? ql & 15 : ql >> 4;
    const int high = (block.qh[32 * half + l] >> (2 * group)) & 3;
    EXPECT_EQ(out[e], 0.5f * kScales[e / 16] * ((low | high << 4) - 32)) << e;
  }
  EXPECT_EQ(out[0], -16.0f);  // ql 0, qh 0: q = 0 -> 0.5 * 1 * -32
  EXPECT_EQ(out[200],
            -280.0f);        // half 1, group 2, l 8: ql[72] = 0x48 -> 4, qh[40] = 0xC8 -> 0: 0.5*20*(4-32)
  EXPECT_EQ(out[5], -5.5f);  // ql[5] = 5, qh[5] = 0xB9 -> bits 0,1 = 1: q = 21 -> 0.5*1*(21-32)
  EXPECT_EQ(out[39],
            -37.5f);           // group 1, l 7: ql[39] = 0x27 -> 7, qh[7] = 0x03 -> bits 2,3 = 0: 0.5*3*(7-32)
  EXPECT_EQ(out[127], 52.0f);  // group 3, l 31: ql[63] = 0x3F -> 3, qh[31] = 0x7B -> bits 6,7 = 1:
                               // q = 19 -> 0.5*-8*(19-32)
}

TEST(DequantizeQ8_K, ScalesByFloatD) {
  BlockQ8_K block{};
  block.d = -0.25f;
  for (int i = 0; i < 256; ++i) block.qs[i] = static_cast<int8_t>(i - 128);
  float out[256];
  DequantizeRow(GgmlType::kQ8_K, &block, out, 256);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(out[i], -0.25f * (i - 128));
}

TEST(DequantizeFloat, F16AndBF16) {
  const f16_bits h[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
  float out[4];
  DequantizeRow(GgmlType::kF16, h, out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 5.9604644775390625e-08f);
  EXPECT_EQ(out[3], 65504.0f);
  const bf16_bits b[2] = {0x3F80, 0xC040};
  DequantizeRow(GgmlType::kBF16, b, out, 2);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
}

}  // namespace
}  // namespace mer
