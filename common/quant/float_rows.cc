// F32, F16 and BF16 row kernels, compiled once per SIMD variant (row_kernels.h). The avx512
// variant takes the same 256-bit steps: 16-lane ones measured no faster on Zen 4 for F32 and BF16,
// and slower for F16 (vec_dot_bench 2048 256: 20.7 against 13.7 us, the 512-bit vcvtph2ps).
#include "common/quant/row_kernels.h"
#include "common/quant/simd_internal.h"

namespace mer::quant_internal::MER_QUANT_VARIANT {
namespace {

// Loaders of 8 consecutive elements as f32 lanes.
struct LoadF32 {
  using Elem = float;
  static __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
  static float One(const float* p) { return *p; }
};
struct LoadF16 {
  using Elem = f16_bits;
  static __m256 Load8(const f16_bits* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float One(const f16_bits* p) { return F16ToF32(*p); }
};
struct LoadBF16 {
  using Elem = bf16_bits;
  static __m256 Load8(const bf16_bits* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static float One(const bf16_bits* p) { return BF16ToF32(*p); }
};

// R rows at once so each activation vector is loaded (and widened) once per R rows. Every row
// keeps two accumulators, summed in the same order whatever R is, so results don't depend on how
// rows are grouped; R = 4 gives 8 independent FMA chains, enough to hide the FMA latency.
template <int R, typename L>
void FloatRowsKernel(const typename L::Elem* w, const typename L::Elem* a, int64_t n, float* out) {
  __m256 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a0 = L::Load8(a + i);
    const __m256 a1 = L::Load8(a + i + 8);
    ForEachRow<R>([&](auto r) {
      acc0[r] = _mm256_fmadd_ps(L::Load8(w + r * n + i), a0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(L::Load8(w + r * n + i + 8), a1, acc1[r]);
    });
  }
  if (i + 8 <= n) {
    const __m256 a0 = L::Load8(a + i);
    for (int r = 0; r < R; ++r) acc0[r] = _mm256_fmadd_ps(L::Load8(w + r * n + i), a0, acc0[r]);
    i += 8;
  }
  for (int r = 0; r < R; ++r) {
    float sum = HorizontalSum(_mm256_add_ps(acc0[r], acc1[r]));
    for (int64_t j = i; j < n; ++j) sum += L::One(w + r * n + j) * L::One(a + j);
    out[r] = sum;
  }
}

template <typename L>
void FloatRows(const typename L::Elem* rows, int64_t n_rows, const typename L::Elem* a, int64_t n, float* out) {
  ForRowGroups<4>(n_rows, [&](auto group, int64_t r) { FloatRowsKernel<group, L>(rows + r * n, a, n, out + r); });
}

}  // namespace

void F32Rows(const float* rows, int64_t n_rows, const float* a, int64_t n, float* out) {
  FloatRows<LoadF32>(rows, n_rows, a, n, out);
}

void F16Rows(const f16_bits* rows, int64_t n_rows, const f16_bits* a, int64_t n, float* out) {
  FloatRows<LoadF16>(rows, n_rows, a, n, out);
}

void BF16Rows(const bf16_bits* rows, int64_t n_rows, const bf16_bits* a, int64_t n, float* out) {
  FloatRows<LoadBF16>(rows, n_rows, a, n, out);
}

}  // namespace mer::quant_internal::MER_QUANT_VARIANT
