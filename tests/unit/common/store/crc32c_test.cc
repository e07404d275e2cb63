#include "common/store/crc32c.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace mer {
namespace {

uint32_t Crc(const std::string& s) { return Crc32c(s.data(), s.size()); }

// Reference values: RFC 3720 (iSCSI) appendix B.4 and the common check value.
TEST(Crc32c, KnownValues) {
  EXPECT_EQ(Crc(""), 0u);
  EXPECT_EQ(Crc("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc(descending), 0x113FDB5Cu);
}

TEST(Crc32c, PortableAndHardwareAgreeAtEveryLengthAndAlignment) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> data(3 * 8192 * 3 + 4096);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  // Lengths around the 8-byte, 3 x 256 and 3 x 8192 boundaries of the hardware path.
  std::vector<size_t> lengths;
  for (size_t n = 0; n < 80; ++n) lengths.push_back(n);
  for (size_t base : {768u, 24576u, 49152u, 73728u})
    for (int d = -9; d <= 9; ++d) lengths.push_back(base + d);
  lengths.push_back(data.size() - 8);
  for (size_t n : lengths) {
    for (size_t align = 0; align < 8; ++align) {
      if (n + align > data.size()) continue;
      const uint32_t portable = Crc32cPortable(0, data.data() + align, n);
      EXPECT_EQ(Crc32c(data.data() + align, n), portable) << n << " " << align;
      if (Crc32cHasHardware()) {
        EXPECT_EQ(Crc32cHardware(0, data.data() + align, n), portable) << n;
      }
    }
  }
}

TEST(Crc32c, ExtendComposes) {
  std::mt19937_64 rng(9);
  std::vector<uint8_t> data(100000);
  for (uint8_t& b : data) b = static_cast<uint8_t>(rng());
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t split : {0u, 1u, 7u, 4096u, 30000u, 99999u, 100000u}) {
    const uint32_t a = Crc32c(data.data(), split);
    EXPECT_EQ(Crc32cExtend(a, data.data() + split, data.size() - split), whole) << split;
    EXPECT_EQ(Crc32cPortable(Crc32cPortable(0, data.data(), split), data.data() + split, data.size() - split), whole);
  }
}

TEST(Crc32c, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> data(4096, 0x5a);
  const uint32_t good = Crc32c(data.data(), data.size());
  for (size_t i = 0; i < data.size(); i += 61) {
    for (int bit = 0; bit < 8; ++bit) {
      data[i] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(Crc32c(data.data(), data.size()), good);
      data[i] ^= static_cast<uint8_t>(1 << bit);
    }
  }
}

// Prints the speed of both paths on 64 MiB (the verification of a store is bound by this or by
// the disk); the hardware path must reach a few GB/s in an optimized build.
TEST(Crc32c, Throughput) {
  std::vector<uint8_t> data(64 << 20, 1);
  // 64 MiB from memory (3 passes), and 256 KiB in cache (768 passes).
  const auto gbps = [&](uint32_t (*f)(uint32_t, const void*, size_t), size_t n, int reps) {
    volatile uint32_t sink = f(0, data.data(), n);  // warm up
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) sink = sink + f(0, data.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return reps * static_cast<double>(n) / s / 1e9;
  };
  std::printf("crc32c portable: %.2f GB/s from memory, %.2f GB/s in cache\n", gbps(&Crc32cPortable, data.size(), 3),
              gbps(&Crc32cPortable, 256 << 10, 768));
  if (!Crc32cHasHardware()) GTEST_SKIP() << "no SSE4.2";
  const double hardware = gbps(&Crc32cHardware, data.size(), 3);
  std::printf("crc32c sse4.2:   %.2f GB/s from memory, %.2f GB/s in cache\n", hardware,
              gbps(&Crc32cHardware, 256 << 10, 768));
#if !defined(__SANITIZE_ADDRESS__) && defined(__OPTIMIZE__)
  EXPECT_GT(hardware, 2.0);
#endif
}

}  // namespace
}  // namespace mer
