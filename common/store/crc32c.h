// CRC-32C (Castagnoli, the iSCSI / ext4 / LevelDB checksum): reflected polynomial 0x82F63B78,
// initial value and final xor 0xFFFFFFFF, so Crc32c("123456789") == 0xE3069283.
//
// On x86-64 CPUs with SSE4.2 it uses the crc32 instruction, 8 bytes per step in three interleaved
// streams (the instruction's latency is 3 cycles, its throughput 1 per cycle), about 3x one
// stream; elsewhere a portable slicing-by-8 table loop (~1 GB/s). The choice is made once, at
// first use, from CPUID.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mer {

// CRC-32C of `n` bytes.
uint32_t Crc32c(const void* data, size_t n);
// The CRC-32C of (the bytes whose CRC is `crc`) followed by `data`: Crc32c(a + b) ==
// Crc32cExtend(Crc32c(a), b). Crc32cExtend(0, x) == Crc32c(x).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The implementations, exposed for tests and benchmarks. Both compute the same function.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t n);  // CHECKs Crc32cHasHardware()
bool Crc32cHasHardware();

}  // namespace mer
