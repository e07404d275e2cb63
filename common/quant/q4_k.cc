#include "common/quant/q4_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/simd_internal.h"

namespace mer {
namespace {

constexpr int kQK = kKBlockSize;
constexpr int kSub = 32;  // elements per sub-block

inline int NearestInt(float v) {
  const float biased = v + 12582912.0f;  // 1.5 * 2^23: rounds half to even into the low bits
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// Fits x[i] ~ scale * L[i] - min over one sub-block, L[i] in [0, nmax], min >= 0, minimising the
// weighted squared error: a start from the (lo, hi) range, then 21 trial inverse scales around
// nmax / (hi - lo), each followed by the closed-form least-squares scale and offset for its L.
// Returns scale; *min_out = min. (The make_qkx2_quants search of ggml.)
float FitScaleMin(const float* x, const float* w, int nmax, uint8_t* L, float* min_out) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < kSub; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;  // a positive offset would have to be stored as a negative min
  if (hi == lo) {
    std::fill(L, L + kSub, 0);
    *min_out = -lo;
    return 0.0f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1.0f / iscale;
  float best_err = 0.0f;
  for (int i = 0; i < kSub; ++i) {
    const int l = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
    L[i] = static_cast<uint8_t>(l);
    const float diff = scale * l + lo - x[i];
    best_err += w[i] * diff * diff;
  }
  uint8_t trial[kSub];
  for (int step = 0; step <= 20; ++step) {
    iscale = (-1.0f + 0.1f * step + nmax) / (hi - lo);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < kSub; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - lo)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * l;
      sum_l2 += w[i] * l * l;
      sum_xl += w[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_lo = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_lo > 0) {
      this_lo = 0;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0;
    for (int i = 0; i < kSub; ++i) {
      const float diff = this_scale * trial[i] + this_lo - x[i];
      err += w[i] * diff * diff;
    }
    if (err < best_err) {
      std::memcpy(L, trial, kSub);
      best_err = err;
      scale = this_scale;
      lo = this_lo;
    }
  }
  *min_out = -lo;
  return scale;
}

void QuantizeBlock(const float* x, BlockQ4_K* y) {
  float scales[8], mins[8];
  uint8_t L[kQK];
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + kSub * j;
    float sum_x2 = 0;
    for (int i = 0; i < kSub; ++i) sum_x2 += xs[i] * xs[i];
    // Weight large-magnitude elements more, as ggml does without an importance matrix.
    const float av_x = std::sqrt(sum_x2 / kSub);
    float weights[kSub];
    for (int i = 0; i < kSub; ++i) weights[i] = av_x + std::fabs(xs[i]);
    scales[j] = FitScaleMin(xs, weights, 15, L + kSub * j, &mins[j]);
  }
  const float max_scale = *std::max_element(scales, scales + 8);
  const float max_min = *std::max_element(mins, mins + 8);
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::memset(y->scales, 0, sizeof(y->scales));
  for (int j = 0; j < 8; ++j) {
    const int ls = std::min(63, NearestInt(inv_scale * scales[j]));
    const int lm = std::min(63, NearestInt(inv_min * mins[j]));
    if (j < 4) {
      y->scales[j] = static_cast<uint8_t>(ls);
      y->scales[j + 4] = static_cast<uint8_t>(lm);
    } else {
      y->scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      y->scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      y->scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  y->d = F32ToF16(max_scale / 63.0f);
  y->dmin = F32ToF16(max_min / 63.0f);
  // Requantize against the scales as they will be decoded (6-bit, times f16 d and dmin).
  const float d = F16ToF32(y->d), dmin = F16ToF32(y->dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    Q4_KScaleMin(y->scales, j, &sc, &m);
    const float dj = d * sc;
    const float mj = dmin * m;
    for (int i = 0; i < kSub; ++i) {
      L[kSub * j + i] =
          dj == 0.0f
              ? 0
              : static_cast<uint8_t>(std::clamp(NearestInt((x[kSub * j + i] + mj) / dj), 0, 15));
    }
  }
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      y->qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
    }
  }
}

#if defined(MER_QUANT_AVX2)

// The 8 six-bit scales and mins of a Q4_K block as bytes sc[0..7], m[0..7]: the packing of
// blocks.h undone four bytes at a time, in dword lanes u0, u1, u2 of the scales array:
//   sc[0..3] = u0 & 0x3f..   sc[4..7] = (u2 & 0x0f..) | ((u0 >> 2) & 0x30..)
//   m[0..3]  = u1 & 0x3f..   m[4..7]  = ((u2 >> 4) & 0x0f..) | ((u1 >> 2) & 0x30..)
// The 16-byte load reads 4 bytes of qs after the 12 scale bytes, inside the block.
inline __m128i DecodeScalesMins(const uint8_t* scales) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  const __m128i low_bits = _mm_and_si128(
      _mm_srlv_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
      _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i high_bits =
      _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(x, _MM_SHUFFLE(1, 1, 0, 0)), 2),
                    _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low_bits, high_bits);
}

// R weight rows against one activation row; per row one f32 accumulator for the d term and
// one for the dmin term, updated identically for every R.
template <bool kVnni, int R>
void Q4_KRowsKernel(const BlockQ4_K* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  __m128 acc_m[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    acc_m[r] = _mm_setzero_ps();
  }
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // pshufb masks: byte j of the decoded scales -> dword j holding sc[j] in both int16 halves
  // (sc[0..3] from the low 128 bits, sc[4..7] from the high); m[0..7] -> int16 lanes.
  const __m256i to_scale_pairs =
      _mm256_setr_epi8(0, -128, 0, -128, 1, -128, 1, -128, 2, -128, 2, -128, 3, -128, 3, -128, 4,
                       -128, 4, -128, 5, -128, 5, -128, 6, -128, 6, -128, 7, -128, 7, -128);
  const __m128i to_mins =
      _mm_setr_epi8(8, -128, 9, -128, 10, -128, 11, -128, 12, -128, 13, -128, 14, -128, 15, -128);
  // The scales go through memory so that each sub-block's broadcast is a load (the load ports
  // have slack here) rather than a shuffle competing with the arithmetic.
  alignas(32) int32_t scale_pairs[8];
  for (int64_t b = 0; b < nb; ++b) {
    // Each row's weights ~1 KiB ahead, every cache line of a block (see Q8_0RowsKernel).
    for (int r = 0; r < R; ++r)
      for (size_t line = 0; line < sizeof(BlockQ4_K); line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(&w[r * nb + b]) + 1024 + line, _MM_HINT_T0);
    const BlockQ8_K& ab = a[b];
    const int8_t* aq = ab.qs;
    // Sums of the activation quants over each 32-element sub-block, for the dmin term.
    const __m128i bsum_pairs =
        _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ab.bsums)),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(ab.bsums + 8)));
    const __m128 da = _mm_set1_ps(ab.d);
    quant_internal::ForEachRow<R>([&](auto r) {
      const BlockQ4_K& wb = w[r * nb + b];
      const __m128i sm = DecodeScalesMins(wb.scales);
      int32_t* const pairs = quant_internal::Opaque(scale_pairs);
      _mm256_store_si256(reinterpret_cast<__m256i*>(scale_pairs),
                         _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(sm), to_scale_pairs));
      // d and dmin (adjacent f16) times the activation scale: lanes 0 and 1.
      const __m128 dd = _mm_mul_ps(
          _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(quant_internal::LoadU32(&wb.d)))), da);
      const __m128i prod_m = _mm_madd_epi16(_mm_shuffle_epi8(sm, to_mins), bsum_pairs);
      acc_m[r] = _mm_fmadd_ps(_mm_shuffle_ps(dd, dd, 0x55), _mm_cvtepi32_ps(prod_m), acc_m[r]);
      // q4 <= 15 and |a| <= 127 keep the int16 pair sums of maddubs far from saturation, and
      // each int32 lane of the scaled block sum stays below 2^22, so its f32 conversion is exact.
      // One short dependency chain per 64-element chunk, summed at the end: a single chain
      // through 8 multiply-accumulates would be latency-bound.
      __m256i chunk_sums[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qs + 32 * c));
        const __m256i lo = _mm256_and_si256(q, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
        const __m256i p_lo = _mm256_maddubs_epi16(
            lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 64 * c)));
        const __m256i p_hi = _mm256_maddubs_epi16(
            hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 64 * c + 32)));
        chunk_sums[c] =
            quant_internal::DotI16<kVnni>(_mm256_madd_epi16(p_lo, _mm256_set1_epi32(pairs[2 * c])),
                                          p_hi, _mm256_set1_epi32(pairs[2 * c + 1]));
      }
      const __m256i sumi = _mm256_add_epi32(_mm256_add_epi32(chunk_sums[0], chunk_sums[1]),
                                            _mm256_add_epi32(chunk_sums[2], chunk_sums[3]));
      acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dd), _mm256_cvtepi32_ps(sumi), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) {
    out[r] = quant_internal::HorizontalSum(acc[r]) - quant_internal::HorizontalSum(acc_m[r]);
  }
}

// Rows per kernel call: 4 where AVX-512VL's 32 vector registers hold their accumulators and
// constants; with AVX2's 16, 4 rows spill and 2 are faster.
#if defined(__AVX512VL__)
constexpr int kRowGroup = 4;
#else
constexpr int kRowGroup = 2;
#endif

template <bool kVnni>
void Q4_KRows(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kQK;
  int64_t r = 0;
  for (; r + kRowGroup <= n_rows; r += kRowGroup) {
    Q4_KRowsKernel<kVnni, kRowGroup>(rows + r * nb, nb, a, out + r);
  }
  for (; r < n_rows; ++r) Q4_KRowsKernel<kVnni, 1>(rows + r * nb, nb, a, out + r);
}

#endif  // MER_QUANT_AVX2

}  // namespace

void QuantizeRowQ4_K(const float* src, BlockQ4_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void DequantizeRowQ4_K(const BlockQ4_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ4_K& x = src[b];
    const float d = F16ToF32(x.d), dmin = F16ToF32(x.dmin);
    float* y = dst + b * kQK;
    for (int c = 0; c < 4; ++c) {
      uint8_t sc_lo, m_lo, sc_hi, m_hi;
      Q4_KScaleMin(x.scales, 2 * c, &sc_lo, &m_lo);
      Q4_KScaleMin(x.scales, 2 * c + 1, &sc_hi, &m_hi);
      const float d_lo = d * sc_lo, min_lo = dmin * m_lo;
      const float d_hi = d * sc_hi, min_hi = dmin * m_hi;
      for (int l = 0; l < 32; ++l) {
        y[64 * c + l] = d_lo * (x.qs[32 * c + l] & 0xF) - min_lo;
        y[64 * c + 32 + l] = d_hi * (x.qs[32 * c + l] >> 4) - min_hi;
      }
    }
  }
}

void VecDotRowsQ4_K(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                    float* out) {
  CHECK(n % kQK == 0);
#if defined(MER_QUANT_AVX2)
  Q4_KRows<quant_internal::kHaveVnni>(rows, n_rows, a, n, out);
#else
  VecDotRowsQ4_KScalar(rows, n_rows, a, n, out);
#endif
}

void VecDotRowsQ4_KAvx2(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                        float* out) {
  CHECK(n % kQK == 0);
#if defined(MER_QUANT_AVX2)
  Q4_KRows<false>(rows, n_rows, a, n, out);
#else
  VecDotRowsQ4_KScalar(rows, n_rows, a, n, out);
#endif
}

void VecDotRowsQ4_KScalar(const BlockQ4_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                          float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ4_K& x = rows[r * nb + b];
      const BlockQ8_K& y = a[b];
      int32_t sum_q = 0, sum_m = 0;
      for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        Q4_KScaleMin(x.scales, j, &sc, &m);
        const int chunk = j / 2, shift = 4 * (j % 2);
        int32_t s = 0;
        for (int l = 0; l < 32; ++l)
          s += ((x.qs[32 * chunk + l] >> shift) & 0xF) * y.qs[32 * j + l];
        sum_q += sc * s;
        sum_m += m * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
      }
      sum += F16ToF32(x.d) * y.d * static_cast<float>(sum_q);
      sum -= F16ToF32(x.dmin) * y.d * static_cast<float>(sum_m);
    }
    out[r] = sum;
  }
}

}  // namespace mer
