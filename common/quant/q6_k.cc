#include "common/quant/q6_k.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/base/check.h"
#include "common/quant/simd_internal.h"

namespace mer {
namespace {

constexpr int kQK = kKBlockSize;
constexpr int kSub = 16;   // elements per sub-block
constexpr int kNmax = 32;  // q - 32 in [-32, 31]

inline int NearestInt(float v) {
  const float biased = v + 12582912.0f;  // 1.5 * 2^23: rounds half to even into the low bits
  int32_t bits;
  std::memcpy(&bits, &biased, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// 6-bit code (q in [0, 63]) of element e of a block.
inline int Q6Code(const BlockQ6_K& x, int e) {
  const int half = e / 128, group = (e % 128) / 32, l = e % 32;
  const uint8_t ql = x.ql[64 * half + l + 32 * (group & 1)];
  const uint8_t low = group < 2 ? (ql & 0xF) : (ql >> 4);
  const uint8_t high = (x.qh[32 * half + l] >> (2 * group)) & 3;
  return low | (high << 4);
}

// Fits x[i] ~ scale * (L[i] - 32) with L[i] in [0, 63] over one sub-block, weighting by x^2:
// the largest-magnitude element maps to -32 (the one extra negative level), then 18 trial inverse
// scales around 32 / max, keeping the least-squares scale of the best. Returns the (signed)
// scale. (The make_qx_quants search of ggml, rmse_type 1.)
float FitSignedScale(const float* x, uint8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < kSub; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < 1e-15f) {
    std::fill(L, L + kSub, kNmax);
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = *suml2 = 0;
    for (int i = 0; i < kSub; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -kNmax, kNmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  auto assign = [&](float iscale) {
    for (int i = 0; i < kSub; ++i) {
      L[i] = static_cast<uint8_t>(kNmax + std::clamp(NearestInt(iscale * x[i]), -kNmax, kNmax - 1));
    }
  };
  float sumlx, suml2;
  float iscale = -kNmax / max;
  fit(iscale, &sumlx, &suml2);
  assign(iscale);
  float scale = suml2 > 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;  // the error reduction of the least-squares scale
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    iscale = -(kNmax + 0.1f * step) / max;
    fit(iscale, &sumlx, &suml2);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      assign(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

void QuantizeBlock(const float* x, BlockQ6_K* y) {
  uint8_t L[kQK];
  float scales[kQK / kSub];
  float max_scale = 0, max_abs_scale = 0;
  for (int j = 0; j < kQK / kSub; ++j) {
    scales[j] = FitSignedScale(x + kSub * j, L + kSub * j);
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  std::memset(y, 0, sizeof(*y));
  if (max_abs_scale < 1e-15f) return;  // all zero: d = 0 decodes everything to 0
  // The largest sub-block scale maps to -128, the extra negative int8 level.
  const float iscale = -128.0f / max_scale;
  y->d = F32ToF16(1.0f / iscale);
  for (int j = 0; j < kQK / kSub; ++j) {
    y->scales[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[j])));
  }
  // Requantize against the scales as they will be decoded.
  const float d = F16ToF32(y->d);
  for (int j = 0; j < kQK / kSub; ++j) {
    const float dj = d * y->scales[j];
    for (int i = 0; i < kSub; ++i) {
      L[kSub * j + i] =
          dj == 0.0f ? kNmax
                     : static_cast<uint8_t>(
                           kNmax + std::clamp(NearestInt(x[kSub * j + i] / dj), -kNmax, kNmax - 1));
    }
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* Lh = L + 128 * half;
    for (int l = 0; l < 32; ++l) {
      y->ql[64 * half + l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
      y->ql[64 * half + l + 32] =
          static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
      y->qh[32 * half + l] =
          static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) |
                               ((Lh[l + 96] >> 4) << 6));
    }
  }
}

#if defined(MER_QUANT_AVX2)

// pshufb masks: for the k-th 32-element group of a half block, int16 lane 2k (the scale of its
// first 16 elements) into every int16 of the low 128 bits and lane 2k + 1 into the high 128 bits.
struct ScaleShuffles {
  alignas(32) uint8_t bytes[4][32];
};
constexpr ScaleShuffles MakeScaleShuffles() {
  ScaleShuffles t{};
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < 32; ++i) {
      const int lane = i < 16 ? 2 * k : 2 * k + 1;
      t.bytes[k][i] = static_cast<uint8_t>(2 * lane + i % 2);
    }
  }
  return t;
}
constexpr ScaleShuffles kScaleShuffles = MakeScaleShuffles();

// R weight rows against one activation row; per row one f32 accumulator, updated identically
// for every R.
template <bool kVnni, int R>
void Q6_KRowsKernel(const BlockQ6_K* w, int64_t nb, const BlockQ8_K* a, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i shuffles[4];
  for (int k = 0; k < 4; ++k)
    shuffles[k] = _mm256_load_si256(reinterpret_cast<const __m256i*>(kScaleShuffles.bytes[k]));
  for (int64_t b = 0; b < nb; ++b) {
    // Each row's weights ~1 KiB ahead, every cache line of a block (see Q8_0RowsKernel).
    for (int r = 0; r < R; ++r)
      for (size_t line = 0; line < sizeof(BlockQ6_K); line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(&w[r * nb + b]) + 1024 + line, _MM_HINT_T0);
    const BlockQ8_K& ab = a[b];
    const int8_t* aq = ab.qs;
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.bsums));
    quant_internal::ForEachRow<R>([&](auto r) {
      const BlockQ6_K& wb = w[r * nb + b];
      const __m256i scales =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.scales)));
      // The -32 offset of every code, taken out through the activation sums of each sub-block:
      // sum (q - 32) * a * sc = sum q * a * sc - 32 * sum sc * bsum.
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(scales, bsums), 5);
      // Four short dependency chains (two 32-element groups each), summed at the end: a single
      // chain through 8 multiply-accumulates would be latency-bound.
      __m256i group_sums[4];
      for (int half = 0; half < 2; ++half) {
        const __m256i half_scales = half == 0 ? _mm256_permute2x128_si256(scales, scales, 0x00)
                                              : _mm256_permute2x128_si256(scales, scales, 0x11);
        const uint8_t* ql = wb.ql + 64 * half;
        const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
        const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb.qh + 32 * half));
        const __m256i q_lo1 = _mm256_srli_epi16(ql0, 4);
        const __m256i q_lo3 = _mm256_srli_epi16(ql1, 4);
        __m256i q[4];
#if defined(__AVX512VL__)
        // Each code is (low nibble source & 0x0F) | (qh bits moved to bits 4, 5), one bitwise
        // select (vpternlog, A where the 0x0F mask is set, else B) each. The qh operands are
        // pre-masked to bits {0,1,4,5} or {2,3,6,7} so that after their 16-bit shifts bits 6, 7 of
        // every byte are zero; whatever the shifts move into bits 0..3 is not selected.
        const __m256i qh_a = _mm256_and_si256(qh, _mm256_set1_epi8(0x33));
        const __m256i qh_b = _mm256_and_si256(qh, _mm256_set1_epi8(char(0xCC)));
        constexpr int kSelect = 0xE4;  // (C & A) | (~C & B) for operands (A, B, C)
        q[0] = _mm256_ternarylogic_epi32(ql0, _mm256_slli_epi16(qh_a, 4), low4, kSelect);
        q[1] = _mm256_ternarylogic_epi32(ql1, _mm256_slli_epi16(qh_b, 2), low4, kSelect);
        q[2] = _mm256_ternarylogic_epi32(q_lo1, qh_a, low4, kSelect);
        q[3] = _mm256_ternarylogic_epi32(q_lo3, _mm256_srli_epi16(qh_b, 2), low4, kSelect);
#else
        const __m256i bits45 = _mm256_set1_epi8(0x30);
        q[0] = _mm256_or_si256(_mm256_and_si256(ql0, low4),
                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
        q[1] = _mm256_or_si256(_mm256_and_si256(ql1, low4),
                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
        q[2] = _mm256_or_si256(_mm256_and_si256(q_lo1, low4), _mm256_and_si256(qh, bits45));
        q[3] = _mm256_or_si256(_mm256_and_si256(q_lo3, low4),
                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
#endif
        // q <= 63, |a| <= 127: the int16 pair sums of maddubs stay below 2^14.
        __m256i p[4];
        for (int k = 0; k < 4; ++k) {
          p[k] = _mm256_maddubs_epi16(
              q[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 128 * half + 32 * k)));
        }
        for (int k = 0; k < 4; k += 2) {
          group_sums[2 * half + k / 2] = quant_internal::DotI16<kVnni>(
              _mm256_madd_epi16(p[k], _mm256_shuffle_epi8(half_scales, shuffles[k])), p[k + 1],
              _mm256_shuffle_epi8(half_scales, shuffles[k + 1]));
        }
      }
      const __m256i sumi =
          _mm256_sub_epi32(_mm256_add_epi32(_mm256_add_epi32(group_sums[0], group_sums[1]),
                                            _mm256_add_epi32(group_sums[2], group_sums[3])),
                           offset);
      acc[r] =
          _mm256_fmadd_ps(_mm256_set1_ps(F16ToF32(wb.d) * ab.d), _mm256_cvtepi32_ps(sumi), acc[r]);
    });
  }
  for (int r = 0; r < R; ++r) out[r] = quant_internal::HorizontalSum(acc[r]);
}

template <bool kVnni>
void Q6_KRows(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n, float* out) {
  const int64_t nb = n / kQK;
  int64_t r = 0;
  for (; r + 4 <= n_rows; r += 4) Q6_KRowsKernel<kVnni, 4>(rows + r * nb, nb, a, out + r);
  for (; r < n_rows; ++r) Q6_KRowsKernel<kVnni, 1>(rows + r * nb, nb, a, out + r);
}

#endif  // MER_QUANT_AVX2

}  // namespace

void QuantizeRowQ6_K(const float* src, BlockQ6_K* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlock(src + b * kQK, dst + b);
}

void DequantizeRowQ6_K(const BlockQ6_K* src, float* dst, int64_t n) {
  CHECK(n % kQK == 0);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const BlockQ6_K& x = src[b];
    const float d = F16ToF32(x.d);
    for (int e = 0; e < kQK; ++e) dst[b * kQK + e] = d * x.scales[e / kSub] * (Q6Code(x, e) - 32);
  }
}

void VecDotRowsQ6_K(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                    float* out) {
  CHECK(n % kQK == 0);
#if defined(MER_QUANT_AVX2)
  Q6_KRows<quant_internal::kHaveVnni>(rows, n_rows, a, n, out);
#else
  VecDotRowsQ6_KScalar(rows, n_rows, a, n, out);
#endif
}

void VecDotRowsQ6_KAvx2(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                        float* out) {
  CHECK(n % kQK == 0);
#if defined(MER_QUANT_AVX2)
  Q6_KRows<false>(rows, n_rows, a, n, out);
#else
  VecDotRowsQ6_KScalar(rows, n_rows, a, n, out);
#endif
}

void VecDotRowsQ6_KScalar(const BlockQ6_K* rows, int64_t n_rows, const BlockQ8_K* a, int64_t n,
                          float* out) {
  CHECK(n % kQK == 0);
  const int64_t nb = n / kQK;
  for (int64_t r = 0; r < n_rows; ++r) {
    float sum = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ6_K& x = rows[r * nb + b];
      const BlockQ8_K& y = a[b];
      int32_t sumi = 0;
      for (int j = 0; j < kQK / kSub; ++j) {
        int32_t s = 0;
        for (int i = kSub * j; i < kSub * (j + 1); ++i) s += (Q6Code(x, i) - 32) * y.qs[i];
        sumi += x.scales[j] * s;
      }
      sum += F16ToF32(x.d) * y.d * static_cast<float>(sumi);
    }
    out[r] = sum;
  }
}

}  // namespace mer
