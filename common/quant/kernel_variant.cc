#include "common/quant/kernel_variant.h"

#include <cpuid.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/status.h"
#include "common/quant/float_dot.h"
#include "common/quant/iq1.h"
#include "common/quant/iq2.h"
#include "common/quant/iq3.h"
#include "common/quant/iq4.h"
#include "common/quant/legacy.h"
#include "common/quant/q2_k.h"
#include "common/quant/q3_k.h"
#include "common/quant/q4_k.h"
#include "common/quant/q5_k.h"
#include "common/quant/q6_k.h"
#include "common/quant/q8_0.h"
#include "common/quant/row_kernels.h"

namespace mer {
namespace {

constexpr char kEnvironmentVariable[] = "MER_CPU_KERNELS";

// CPUID leaf 1, ECX bit 29. (GCC's __builtin_cpu_supports has no "f16c".)
bool CpuHasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

// MissingCpuFeatures for every variant, computed once.
struct Support {
  std::string missing[3];
  bool ok[3];
};

const Support& CpuSupport() {
  static const Support support = [] {
    __builtin_cpu_init();
    Support s;
    for (KernelVariant v : kKernelVariants) {
      std::string& missing = s.missing[static_cast<int>(v)];
      // __builtin_cpu_supports also asks the OS (XGETBV) whether it saves the ymm / zmm state.
      auto need = [&missing](bool have, const char* name) {
        if (!have) absl::StrAppend(&missing, missing.empty() ? "" : " ", name);
      };
      if (v == KernelVariant::kAvx512) {
        need(__builtin_cpu_supports("avx512f"), "avx512f");
        need(__builtin_cpu_supports("avx512bw"), "avx512bw");
        need(__builtin_cpu_supports("avx512vl"), "avx512vl");
        need(__builtin_cpu_supports("avx512dq"), "avx512dq");
        need(__builtin_cpu_supports("avx512vnni"), "avx512_vnni");
      }
      if (v != KernelVariant::kScalar) {
        // The baseline of the build, which the scalar variant's process needs as well; but a CPU
        // without it does not get this far.
        need(__builtin_cpu_supports("avx2"), "avx2");
        need(__builtin_cpu_supports("fma"), "fma");
        need(CpuHasF16c(), "f16c");
      }
      s.ok[static_cast<int>(v)] = missing.empty();
    }
    return s;
  }();
  return support;
}

}  // namespace

const char* KernelVariantName(KernelVariant v) {
  switch (v) {
    case KernelVariant::kScalar:
      return "scalar";
    case KernelVariant::kAvx2:
      return "avx2";
    case KernelVariant::kAvx512:
      return "avx512";
  }
  CHECK_MSG(false, "unknown KernelVariant");
}

std::string MissingCpuFeatures(KernelVariant v) { return CpuSupport().missing[static_cast<int>(v)]; }

bool CpuSupports(KernelVariant v) { return CpuSupport().ok[static_cast<int>(v)]; }

absl::StatusOr<KernelVariant> KernelVariantNamed(const std::string& name) {
  if (name.empty() || name == "auto") {
    for (KernelVariant v : kKernelVariants) {
      if (CpuSupports(v)) return v;
    }
  }
  for (KernelVariant v : kKernelVariants) {
    if (name != KernelVariantName(v)) continue;
    if (!CpuSupports(v)) {
      return absl::FailedPreconditionError(
          absl::StrCat("this CPU lacks ", MissingCpuFeatures(v), "; choose auto or a variant it supports"));
    }
    return v;
  }
  return absl::InvalidArgumentError("not a kernel variant (avx512, avx2, scalar or auto)");
}

absl::StatusOr<KernelVariant> KernelVariantFromEnvironment() {
  const char* env = std::getenv(kEnvironmentVariable);
  const std::string name = env != nullptr ? env : "";
  absl::StatusOr<KernelVariant> v = KernelVariantNamed(name);
  if (v.ok()) return v;
  return absl::Status(v.status().code(), absl::StrCat(kEnvironmentVariable, "=", name, ": ", v.status().message()));
}

absl::StatusOr<std::string> DescribeKernelVariant() {
  ASSIGN_OR_RETURN(const KernelVariant v, KernelVariantFromEnvironment());
  const char* env = std::getenv(kEnvironmentVariable);
  std::string runs;
  for (KernelVariant k : kKernelVariants) {
    if (CpuSupports(k)) absl::StrAppend(&runs, runs.empty() ? "" : ", ", KernelVariantName(k));
  }
  return absl::StrCat(KernelVariantName(v), " (", kEnvironmentVariable, "=",
                      env != nullptr && *env != '\0' ? env : "auto", "; this CPU runs ", runs, ")");
}

KernelVariant ActiveKernelVariant() {
  static const KernelVariant active = [] {
    const absl::StatusOr<KernelVariant> v = KernelVariantFromEnvironment();
    CHECK_MSG(v.ok(), std::string(v.status().message()).c_str());
    return *v;
  }();
  return active;
}

namespace quant_internal {

// The SIMD variants' kernels of namespace NS, then the scalar references.
#define MER_SIMD_ROW_KERNELS(NS)                                                                                  \
  {                                                                                                               \
    .f32 = NS::F32Rows, .f16 = NS::F16Rows, .bf16 = NS::BF16Rows, .q8_0 = NS::Q8_0Rows, .q4_0 = NS::Q4_0Rows,     \
    .q4_1 = NS::Q4_1Rows, .q5_0 = NS::Q5_0Rows, .q5_1 = NS::Q5_1Rows, .q2_k = NS::Q2_KRows, .q3_k = NS::Q3_KRows, \
    .q4_k = NS::Q4_KRows, .q5_k = NS::Q5_KRows, .q6_k = NS::Q6_KRows, .iq4_nl = NS::IQ4_NLRows,                   \
    .iq4_xs = NS::IQ4_XSRows, .iq2_xxs = NS::IQ2_XXSRows, .iq2_xs = NS::IQ2_XSRows, .iq3_xxs = NS::IQ3_XXSRows,   \
    .iq3_s = NS::IQ3_SRows, .iq2_s = NS::IQ2_SRows, .iq1_s = NS::IQ1_SRows,                                       \
  }

const RowKernels& RowKernelsOf(KernelVariant v) {
  static constexpr RowKernels kAvx512 = MER_SIMD_ROW_KERNELS(avx512);
  static constexpr RowKernels kAvx2 = MER_SIMD_ROW_KERNELS(avx2);
  static constexpr RowKernels kScalar = {
      .f32 = VecDotRowsF32Scalar,
      .f16 = VecDotRowsF16Scalar,
      .bf16 = VecDotRowsBF16Scalar,
      .q8_0 = VecDotRowsQ8_0Scalar,
      .q4_0 = VecDotRowsQ4_0Scalar,
      .q4_1 = VecDotRowsQ4_1Scalar,
      .q5_0 = VecDotRowsQ5_0Scalar,
      .q5_1 = VecDotRowsQ5_1Scalar,
      .q2_k = VecDotRowsQ2_KScalar,
      .q3_k = VecDotRowsQ3_KScalar,
      .q4_k = VecDotRowsQ4_KScalar,
      .q5_k = VecDotRowsQ5_KScalar,
      .q6_k = VecDotRowsQ6_KScalar,
      .iq4_nl = VecDotRowsIQ4_NLScalar,
      .iq4_xs = VecDotRowsIQ4_XSScalar,
      .iq2_xxs = VecDotRowsIQ2_XXSScalar,
      .iq2_xs = VecDotRowsIQ2_XSScalar,
      .iq3_xxs = VecDotRowsIQ3_XXSScalar,
      .iq3_s = VecDotRowsIQ3_SScalar,
      .iq2_s = VecDotRowsIQ2_SScalar,
      .iq1_s = VecDotRowsIQ1_SScalar,
  };
  switch (v) {
    case KernelVariant::kAvx512:
      return kAvx512;
    case KernelVariant::kAvx2:
      return kAvx2;
    case KernelVariant::kScalar:
      return kScalar;
  }
  CHECK_MSG(false, "unknown KernelVariant");
}

#undef MER_SIMD_ROW_KERNELS

const RowKernels& ActiveRowKernels() {
  static const RowKernels& active = RowKernelsOf(ActiveKernelVariant());
  return active;
}

}  // namespace quant_internal
}  // namespace mer
