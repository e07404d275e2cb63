// Q4_0, Q4_1, Q5_0 and Q5_1 row kernels, compiled once per SIMD variant (row_kernels.h); the
// avx512 variant differs only in vpdpbusd for the byte products. legacy.h states each type's
// f32 order; the int32 sums are exact in any grouping. Q4_0's kernel is table4_rows.h's.
#include <cmath>

#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"
#include "common/quant/table4_rows.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// 0x10 in byte i where bit i of the little-endian u32 at qh is set, else 0: the codes' bit 4.
inline __m256i Bit4s(const uint8_t* qh) {
  // Byte i of the broadcast word moved to lane i, then tested against bit i % 8.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(LoadU32(qh))),
                          _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                             0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(0x10));
}

// Q5_0 in ggml's AVX2 vec_dot order.
template <int R>
void Q5_0RowsKernel(const BlockQ5_0* w, int64_t nb, const BlockQ8_0* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i sixteen = _mm256_set1_epi8(16);
  for (int64_t b = 0; b < nb; ++b) {
    PrefetchRows<R>(w, nb * sizeof(BlockQ5_0), b * sizeof(BlockQ5_0), 1);
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = F16ToF32(a[b].d);
    ForEachRow<R>([&](auto r) {
      const BlockQ5_0& wb = w[r * nb + b];
      const __m256i q = _mm256_sub_epi8(_mm256_or_si256(Nibbles(wb.qs), Bit4s(wb.qh)), sixteen);
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * da),
                               _mm256_cvtepi32_ps(SignedDot(q, av)), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

// Q4_1 and Q5_1 in ggml's AVX2 vec_dot order: unsigned codes, the m * s term in a scalar.
template <int R, typename W, bool kFiveBits>
void AsymmetricRowsKernel(const W* w, int64_t nb, const BlockQ8_1* a, float* out) {
  __m256 acc[R];
  float acc_m[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    acc_m[r] = 0.0f;
  }
  for (int64_t b = 0; b < nb; ++b) {
    PrefetchRows<R>(w, nb * sizeof(W), b * sizeof(W), 1);
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = F16ToF32(a[b].d), sa = F16ToF32(a[b].s);
    ForEachRow<R>([&](auto r) {
      const W& wb = w[r * nb + b];
      __m256i q = Nibbles(wb.qs);
      if constexpr (kFiveBits) q = _mm256_or_si256(q, Bit4s(wb.qh));
      // q <= 31, |a| <= 127: maddubs's int16 pair sums stay below 2^13.
      const __m256i sums = DotU8S8(_mm256_setzero_si256(), q, av);
      acc_m[r] = std::fma(F16ToF32(wb.m), sa, acc_m[r]);
      acc[r] =
          _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * da), _mm256_cvtepi32_ps(sums), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]) + acc_m[r];
}

}  // namespace

void Q4_0Rows(const BlockQ4_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  const __m256i table = _mm256_setr_epi8(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7, -8,
                                         -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  ForRowGroups<8>(n_rows, [&](auto group, int64_t r) {
    Table4RowsKernel<group>(rows + r * nb, nb, a, table, out + r);
  });
}

void Q4_1Rows(const BlockQ4_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  ForRowGroups<4>(n_rows, [&](auto group, int64_t r) {
    AsymmetricRowsKernel<group, BlockQ4_1, false>(rows + r * nb, nb, a, out + r);
  });
}

void Q5_0Rows(const BlockQ5_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  ForRowGroups<4>(
      n_rows, [&](auto group, int64_t r) { Q5_0RowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

void Q5_1Rows(const BlockQ5_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  ForRowGroups<4>(n_rows, [&](auto group, int64_t r) {
    AsymmetricRowsKernel<group, BlockQ5_1, true>(rows + r * nb, nb, a, out + r);
  });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
