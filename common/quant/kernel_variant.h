// Which instruction-set variant of the row kernels (VecDotRows, quant.h) a process runs, chosen
// once at run time from the CPU's features, so that one binary serves every x86-64 host with AVX2.
//
// Variants, each a compilation of the same kernels for a target (common/quant/CMakeLists.txt):
//   avx512  AVX512F/BW/VL/DQ + AVX512-VNNI: 512-bit integer sums, vpdpbusd/vpdpwssd.
//   avx2    AVX2 + FMA + F16C, the baseline every mer binary is built for.
//   scalar  ggml's generic C code (the references the SIMD kernels are tested against).
// avx512 and avx2 give bit-identical results (the same exact int32 lanes, then the same f32
// operations in the same order; tests/unit/common/quant/vec_dot_test.cc), which are llama.cpp's
// AVX2 results and what the cuda backend reproduces. scalar sums in another order: for tests and
// comparisons only.
//
// The environment variable MER_CPU_KERNELS=avx512|avx2|scalar forces a variant (tests, A/B
// benchmarks, a host where a variant misbehaves); unset, empty or "auto" takes the widest one the
// CPU supports. Forcing one the CPU lacks is refused.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/tensor/ggml_type.h"

namespace mer {

enum class KernelVariant { kScalar, kAvx2, kAvx512 };

// Every variant, the widest first.
inline constexpr KernelVariant kKernelVariants[] = {KernelVariant::kAvx512, KernelVariant::kAvx2,
                                                    KernelVariant::kScalar};

// "avx512", "avx2", "scalar": the names MER_CPU_KERNELS takes.
const char* KernelVariantName(KernelVariant v);

// The CPU features variant v needs that this CPU (or the OS, which must save the wider
// registers) lacks, as /proc/cpuinfo names them, space-separated; empty when v can run here.
std::string MissingCpuFeatures(KernelVariant v);
// MissingCpuFeatures(v).empty(), from a table filled once per process.
bool CpuSupports(KernelVariant v);

// The variant of that name, or for "" and "auto" the widest this CPU supports. InvalidArgument
// for an unknown name, FailedPrecondition (naming the missing features) for a variant this CPU
// lacks.
absl::StatusOr<KernelVariant> KernelVariantNamed(const std::string& name);

// KernelVariantNamed(MER_CPU_KERNELS or ""), errors prefixed with "MER_CPU_KERNELS=<value>: ".
absl::StatusOr<KernelVariant> KernelVariantFromEnvironment();

// For logs and `mer info`: the variant KernelVariantFromEnvironment() picks and why, e.g.
// "avx2 (MER_CPU_KERNELS=avx2; this CPU runs avx512, avx2, scalar)"; its error otherwise.
absl::StatusOr<std::string> DescribeKernelVariant();

// The variant VecDotRows runs: KernelVariantFromEnvironment() at the first call, the same for the
// rest of the process. CHECK-fails with that function's message if it returned an error; a
// program that wants to report it as an error of its own calls KernelVariantFromEnvironment first.
KernelVariant ActiveKernelVariant();

// VecDotRows (quant.h) with the kernels of variant v, which this CPU must support (CHECKed):
// for tests and benchmarks that compare variants in one process.
void VecDotRowsWith(KernelVariant v, GgmlType weight_type, const void* weight_rows, int64_t n_rows,
                    const void* activation_row, int64_t n, float* out);

}  // namespace mer
