// Q4_0, Q4_1, Q5_0 and Q5_1 row kernels, compiled once per SIMD variant (row_kernels.h); the
// avx512 variant differs only in vpdpbusd for the byte products. legacy.h states each type's
// f32 order; the int32 sums are exact in any grouping.
#include <cmath>

#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// The 32 codes of a block as bytes in element order: low nibbles of qs[0..15], then high ones.
inline __m256i Nibbles(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 0x10 in byte i where bit i of the little-endian u32 at qh is set, else 0: the codes' bit 4.
inline __m256i Bit4s(const uint8_t* qh) {
  // Byte i of the broadcast word moved to lane i, then tested against bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(LoadU32(qh))),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                         0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(0x10));
}

// Signed weights w times activations a, 4 products per int32 lane: |w| * (a with w's sign).
inline __m256i SignedDot(__m256i w, __m256i a) {
  return DotU8S8(_mm256_setzero_si256(), _mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

// The 8 int32 lanes of v summed, each v[r] of 8 lanes for row r: lane r of the result.
inline __m256i SumLanes8(const __m256i* v) {
  const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
  // u0 = (sums of rows 0-3 over the low 128 bits | over the high 128 bits), u1 the same for 4-7.
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

inline int32_t SumLanes(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 1, 1, 1))));
}

// Q4_0 in ggml's 8-row gemv order: per row one f32, acc = fma(block sum, d_w * d_a, acc). Eight
// rows at a time in the lanes of one vector; R = 1 for the rows left over, with the same
// per-row operations.
template <int R>
void Q4_0RowsKernel(const BlockQ4_0* w, int64_t nb, const BlockQ8_0* a, float* out) {
  static_assert(R == 8 || R == 1);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc8 = _mm256_setzero_ps();
  float acc1 = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    PrefetchRows<R>(w, nb * sizeof(BlockQ4_0), b * sizeof(BlockQ4_0), 1);
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[b].qs));
    const float da = F16ToF32(a[b].d);
    __m256i sums[R];
    for (int r = 0; r < R; ++r)
      sums[r] = SignedDot(_mm256_sub_epi8(Nibbles(w[r * nb + b].qs), eight), av);
    if constexpr (R == 8) {
      alignas(16) f16_bits d[8];
      for (int r = 0; r < 8; ++r) d[r] = w[r * nb + b].d;
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d)));
      acc8 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SumLanes8(sums)),
                             _mm256_mul_ps(dw, _mm256_set1_ps(da)), acc8);
    } else {
      acc1 = std::fma(static_cast<float>(SumLanes(sums[0])), F16ToF32(w[b].d) * da, acc1);
    }
  }
  if constexpr (R == 8) {
    _mm256_storeu_ps(out, acc8);
  } else {
    out[0] = acc1;
  }
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
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * da), _mm256_cvtepi32_ps(sums),
                               acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]) + acc_m[r];
}

}  // namespace

void Q4_0Rows(const BlockQ4_0* rows, int64_t n_rows, const BlockQ8_0* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  ForRowGroups<8>(n_rows, [&](auto group, int64_t r) {
    Q4_0RowsKernel<group>(rows + r * nb, nb, a, out + r);
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
  ForRowGroups<4>(n_rows, [&](auto group, int64_t r) {
    Q5_0RowsKernel<group>(rows + r * nb, nb, a, out + r);
  });
}

void Q5_1Rows(const BlockQ5_1* rows, int64_t n_rows, const BlockQ8_1* a, int64_t n, float* out) {
  const int64_t nb = n / kQ8_0BlockSize;
  ForRowGroups<4>(n_rows, [&](auto group, int64_t r) {
    AsymmetricRowsKernel<group, BlockQ5_1, true>(rows + r * nb, nb, a, out + r);
  });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
