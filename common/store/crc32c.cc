#include "common/store/crc32c.h"

#include <array>
#include <cstring>

#include "common/base/check.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mer {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// Slicing-by-8 tables: kTable[0] is the byte-at-a-time table, kTable[k][b] the CRC of byte b
// followed by k zero bytes.
struct Tables {
  uint32_t t[8][256];
  constexpr Tables() : t() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
};
constexpr Tables kTables;

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (mer targets x86-64 and little-endian ARM)
}

// Raw (unconditioned) CRC update, portable.
uint32_t RawPortable(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = kTables.t;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
    --n;
  }
  while (n >= 8) {
    const uint64_t v = Load64(p) ^ c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)

// The hardware path runs three independent crc32 chains over three adjacent blocks of L bytes
// (the instruction's latency is 3 cycles, its throughput 1 per cycle) and joins them with
//   raw(s, A|B|C) = Shift_L(Shift_L(raw(s, A)) ^ raw(0, B)) ^ raw(0, C),
// where Shift_L(x) = raw(x, L zero bytes) is linear in x and applied with four table lookups.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

struct ShiftTable {
  uint32_t t[4][256];
  uint32_t Apply(uint32_t x) const {
    return t[0][x & 0xff] ^ t[1][(x >> 8) & 0xff] ^ t[2][(x >> 16) & 0xff] ^ t[3][x >> 24];
  }
};

// Shift_L of the 32 unit vectors, by running the portable update over L zero bytes; the table
// entries are XORs of those images (the map is linear over GF(2)).
ShiftTable MakeShiftTable(size_t len) {
  static const uint8_t kZeros[kLong] = {};
  uint32_t basis[32];
  for (int i = 0; i < 32; ++i) basis[i] = RawPortable(uint32_t{1} << i, kZeros, len);
  ShiftTable s;
  for (int k = 0; k < 4; ++k) {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t v = 0;
      for (int bit = 0; bit < 8; ++bit)
        if (b & (1u << bit)) v ^= basis[8 * k + bit];
      s.t[k][b] = v;
    }
  }
  return s;
}

const ShiftTable& LongShift() {
  static const ShiftTable t = MakeShiftTable(kLong);
  return t;
}
const ShiftTable& ShortShift() {
  static const ShiftTable t = MakeShiftTable(kShort);
  return t;
}

__attribute__((target("sse4.2"))) uint32_t Raw3Way(uint32_t c, const uint8_t*& p, size_t& n, size_t len,
                                                   const ShiftTable& shift) {
  while (n >= 3 * len) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    const uint8_t* a = p;
    const uint8_t* b = p + len;
    const uint8_t* d = p + 2 * len;
    for (size_t i = 0; i < len; i += 8) {
      c0 = _mm_crc32_u64(c0, Load64(a + i));
      c1 = _mm_crc32_u64(c1, Load64(b + i));
      c2 = _mm_crc32_u64(c2, Load64(d + i));
    }
    c = shift.Apply(shift.Apply(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^ static_cast<uint32_t>(c2);
    p += 3 * len;
    n -= 3 * len;
  }
  return c;
}

__attribute__((target("sse4.2"))) uint32_t RawHardware(uint32_t c, const uint8_t* p, size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  if (n >= 3 * kShort) {
    c = Raw3Way(c, p, n, kLong, LongShift());
    c = Raw3Way(c, p, n, kShort, ShortShift());
  }
  uint64_t c64 = c;
  while (n >= 8) {
    c64 = _mm_crc32_u64(c64, Load64(p));
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n-- > 0) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool DetectHardware() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("sse4.2");
}

#else

uint32_t RawHardware(uint32_t c, const uint8_t* p, size_t n) { return RawPortable(c, p, n); }
bool DetectHardware() { return false; }

#endif

}  // namespace

bool Crc32cHasHardware() {
  static const bool has = DetectHardware();
  return has;
}

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t n) {
  CHECK(Crc32cHasHardware());
  return ~RawHardware(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  return Crc32cHasHardware() ? ~RawHardware(~crc, p, n) : ~RawPortable(~crc, p, n);
}

uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

}  // namespace mer
