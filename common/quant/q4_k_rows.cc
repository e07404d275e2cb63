// Q4_K x Q8_K row kernels, compiled once per SIMD variant (row_kernels.h). The avx512 variant
// takes two 32-byte chunks of a block per 512-bit step: on Zen 4, 11.0 against 12.1 us for the
// same variant in 256-bit steps and 15.9 for the avx2 variant (vec_dot_bench 2048 256).
//
// Per row and block: 8 int32 lanes, lane k the sum over the block's 4 chunks of 32 bytes and both
// nibbles of bytes 4k .. 4k + 3 times their sub-blocks' scales (exact), converted to f32 and
// added to the row's 8-lane accumulator by one fused multiply-add with d_w * d_a; the mins term
// in a 4-lane accumulator of its own. The same in every variant, so results are bit-identical.
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// q4 <= 15 and |a| <= 127 keep the int16 pair sums of maddubs far from saturation, and each
// int32 lane of the scaled block sum stays below 2^22, so its f32 conversion is exact.

#if defined(MER_QUANT_AVX512)

// The activations of a block in the order the 512-bit steps take them: chunks 0 and 1 (low and
// high 256 bits) of the low nibbles, of the high nibbles, then the same for chunks 2 and 3.
struct BlockActivations {
  __m512i a[4];
  explicit BlockActivations(const int8_t* aq) {
    const auto pair = [aq](int offset) {
      return _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + offset))),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + offset + 64)), 1);
    };
    a[0] = pair(0);
    a[1] = pair(32);
    a[2] = pair(128);
    a[3] = pair(160);
  }
};

// pshufb masks over the decoded scales broadcast to every 128-bit lane, one per activation vector
// above: every int16 of the low 256 bits gets sc[j], of the high 256 bits sc[j + 2], for
// j = 0, 1, 4, 5 (the sub-blocks of a[0], a[1], a[2], a[3]).
struct ScaleMasks {
  __m512i m[4];
  ScaleMasks() {
    constexpr int kFirst[4] = {0, 1, 4, 5};
    for (int i = 0; i < 4; ++i) {
      const __m256i lo = _mm256_set1_epi16(static_cast<short>(0x8000 | kFirst[i]));
      const __m256i hi = _mm256_set1_epi16(static_cast<short>(0x8000 | (kFirst[i] + 2)));
      m[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    }
  }
};

inline __m256i ScaledSums(const BlockQ4_K& wb, __m128i sm, const BlockActivations& act, const ScaleMasks& masks) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i scales = _mm512_broadcast_i32x4(sm);
  __m512i sums[2];
  for (int h = 0; h < 2; ++h) {
    const __m512i q = _mm512_loadu_si512(wb.qs + 64 * h);
    const __m512i lo = _mm512_and_si512(q, low4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
    const __m512i p_lo = _mm512_maddubs_epi16(lo, act.a[2 * h]);
    const __m512i p_hi = _mm512_maddubs_epi16(hi, act.a[2 * h + 1]);
    sums[h] = _mm512_dpwssd_epi32(_mm512_madd_epi16(p_lo, _mm512_shuffle_epi8(scales, masks.m[2 * h])), p_hi,
                                  _mm512_shuffle_epi8(scales, masks.m[2 * h + 1]));
  }
  const __m512i s = _mm512_add_epi32(sums[0], sums[1]);
  return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}

#else

struct BlockActivations {
  const int8_t* aq;
  explicit BlockActivations(const int8_t* q) : aq(q) {}
};

// pshufb mask: byte j of the decoded scales -> dword j holding sc[j] in both int16 halves
// (sc[0..3] from the low 128 bits, sc[4..7] from the high).
struct ScaleMasks {
  __m256i to_scale_pairs = _mm256_setr_epi8(0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3, -128, 3, -128, 4,
                                            -128, 4, -128, 5, -128, 5, -128, 6, -128, 6, -128, 7, -128, 7, -128);
};

inline __m256i ScaledSums(const BlockQ4_K& wb, __m128i sm, const BlockActivations& act, const ScaleMasks& masks) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // The scales go through memory so that each sub-block's broadcast is a load (the load ports
  // have slack here) rather than a shuffle competing with the arithmetic.
  alignas(32) int32_t scale_pairs[8];
  int32_t* const pairs = Opaque(scale_pairs);
  _mm256_store_si256(reinterpret_cast<__m256i*>(scale_pairs),
                     _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sm), masks.to_scale_pairs));
  // One short dependency chain per 64-element chunk, summed at the end: a single chain through 8
  // multiply-accumulates would be latency-bound.
  __m256i chunk_sums[4];
  for (int c = 0; c < 4; ++c) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs + 32 * c));
    const __m256i lo = _mm256_and_si256(q, low4);
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
    const __m256i p_lo =
        _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act.aq + 64 * c)));
    const __m256i p_hi =
        _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act.aq + 64 * c + 32)));
    chunk_sums[c] =
        DotI16(_mm256_madd_epi16(p_lo, _mm256_set1_epi32(pairs[2 * c])), p_hi, _mm256_set1_epi32(pairs[2 * c + 1]));
  }
  return _mm256_add_epi32(_mm256_add_epi32(chunk_sums[0], chunk_sums[1]),
                          _mm256_add_epi32(chunk_sums[2], chunk_sums[3]));
}

#endif

// R weight rows against one activation row; per row one f32 accumulator for the d term and
// one for the dmin term, updated identically for every R.
template <int R>
void Q4_KRowsKernel(const BlockQ4_K* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  __m128 acc_m[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    acc_m[r] = _mm_setzero_ps();
  }
  const ScaleMasks masks;
  // pshufb mask: m[0..7] of the decoded scales -> int16 lanes.
  const __m128i to_mins = _mm_setr_epi8(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128);
  for (int64_t b = 0; b < nb; ++b) {
    // Every cache line a block may touch.
    PrefetchRows<R>(w, nb * sizeof(BlockQ4_K), b * sizeof(BlockQ4_K), 3);
    const BlockQ8_K& ab = a[b];
    const BlockActivations act(ab.qs);
    // Sums of the activation quants over each 32-element sub-block, for the dmin term.
    const __m128i bsum_pairs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ab.bsums)),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(ab.bsums + 8)));
    const __m128 da = _mm_set1_ps(ab.d);
    ForEachRow<R>([&](auto r) {
      const BlockQ4_K& wb = w[r * nb + b];
      const __m128i sm = DecodeQ4_KScalesMins(wb.scales);
      // d and dmin (adjacent f16) times the activation scale: lanes 0 and 1.
      const __m128 dd = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(&wb.d)))), da);
      const __m128i prod_m = _mm_madd_epi16(_mm_shuffle_epi8(sm, to_mins), bsum_pairs);
      acc_m[r] = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, 0x55), _mm_cvtepi32_ps(prod_m), acc_m[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(ScaledSums(wb, sm, act, masks)), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]) - HorizontalSum(acc_m[r]);
}

// Rows per kernel call: 4 where AVX-512's 32 vector registers hold their accumulators and
// constants; with AVX2's 16, 4 rows spill and 2 are faster.
#if defined(MER_QUANT_AVX512)
constexpr int kRowGroup = 4;
#else
constexpr int kRowGroup = 2;
#endif

}  // namespace

void Q4_KRows(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kKBlockSize;
  ForRowGroups<kRowGroup>(n_rows, [&](auto group, int64_t r) { Q4_KRowsKernel<group>(rows + r * nb, nb, a, out + r); });
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
