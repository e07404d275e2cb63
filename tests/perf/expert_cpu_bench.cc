// How long one missed expert takes on the CPU: one routed expert's SwiGLU (gate, up, SwiGLU, down;
// expert_ffn.h) for one token, per tensor types, CPU kernel variant and thread count, the weights
// read from DRAM as from a RAM tier (each repetition takes the next of --copies copies of the
// expert). Medians of --reps. Compare with the upload of the same bytes over PCIe, which
// tests/gpu/miss_path_bench measures on a GPU host (with the same CPU path, for one variant).
//
// Usage: expert_cpu_bench [--embd 2048] [--ff 768] [--types q8_0,q4_k,q4_k+q6_k]
//                         [--threads 1,2,4,8,16] [--kernels avx512,avx2] [--reps 50] [--copies 64]
// Defaults: the Qwen3-30B-A3B expert geometry; threads 1, 2, 4, ... up to the cores this process
// may use, and that count; kernels: the variant chosen at run time (MER_CPU_KERNELS forces it),
// then avx2 when it is another. Exits 1 if the SIMD variants' outputs are not bit-identical.
#include <sched.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"
#include "common/quant/kernel_variant.h"
#include "services/compute/cpu/thread_pool.h"
#include "tests/perf/expert_ffn.h"

namespace mer {
namespace {

absl::StatusOr<std::vector<int>> ParseInts(const std::string& flag, const std::string& s) {
  std::vector<int> v;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int x;
    if (!absl::SimpleAtoi(part, &x) || x < 1)
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", s, "' is not a list of counts"));
    v.push_back(x);
  }
  return v;
}

// 1, 2, 4, ... below the cores this process may run on, then that count.
std::vector<int> DefaultThreadCounts() {
  cpu_set_t set;
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  std::vector<int> v;
  for (int t = 1; t < cores; t *= 2) v.push_back(t);
  v.push_back(cores);
  return v;
}

absl::Status Main(int argc, char** argv) {
  perf::ExpertShape base;
  std::string types = "q8_0,q4_k,q4_k+q6_k";
  std::vector<int> threads = DefaultThreadCounts();
  std::vector<KernelVariant> variants;
  int reps = 50, copies = 64;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
    const std::string value = argv[i + 1];
    int64_t n = 0;
    if (flag == "--embd" && absl::SimpleAtoi(value, &n) && n > 0) {
      base.embd = n;
    } else if (flag == "--ff" && absl::SimpleAtoi(value, &n) && n > 0) {
      base.ff = n;
    } else if (flag == "--types") {
      types = value;
    } else if (flag == "--threads") {
      ASSIGN_OR_RETURN(threads, ParseInts(flag, value));
    } else if (flag == "--kernels") {
      variants.clear();
      for (absl::string_view name : absl::StrSplit(value, ',')) {
        const absl::StatusOr<KernelVariant> v = KernelVariantNamed(std::string(name));
        if (!v.ok()) {
          return absl::Status(v.status().code(), absl::StrCat("--kernels ", name, ": ", v.status().message()));
        }
        variants.push_back(*v);
      }
    } else if (flag == "--reps" && absl::SimpleAtoi(value, &n) && n > 0) {
      reps = static_cast<int>(n);
    } else if (flag == "--copies" && absl::SimpleAtoi(value, &n) && n > 0) {
      copies = static_cast<int>(n);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag or bad value: ", flag, " ", value));
    }
  }
  if (variants.empty()) {
    ASSIGN_OR_RETURN(const KernelVariant chosen, KernelVariantFromEnvironment());
    variants.push_back(chosen);
    if (chosen != KernelVariant::kAvx2) variants.push_back(KernelVariant::kAvx2);
  }
  std::vector<perf::ExpertShape> shapes;
  for (absl::string_view spec : absl::StrSplit(types, ',')) {
    perf::ExpertShape s = base;
    RETURN_IF_ERROR(perf::ParseExpertTypes(std::string(spec), &s));
    shapes.push_back(s);
  }
  ASSIGN_OR_RETURN(const std::string chosen, DescribeKernelVariant());
  std::printf("cpu kernels chosen: %s\n", chosen.c_str());
  std::printf("expert: gate/up %lld x %lld, down %lld x %lld; 1 token; %d copies; medians of %d\n", (long long)base.ff,
              (long long)base.embd, (long long)base.embd, (long long)base.ff, copies, reps);
  std::printf("%-10s %10s %-7s %8s %10s %8s\n", "types", "bytes", "kernels", "threads", "us/expert", "GB/s");

  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(base.embd), out(base.embd);
  for (float& v : x) v = normal(rng);
  for (const perf::ExpertShape& shape : shapes) {
    std::vector<uint8_t> experts(shape.bytes() * copies);
    perf::WriteRandomExperts(shape, copies, 7, experts.data());
    // The SIMD variants compute the same floats (kernel_variant.h): checked on the first copy.
    std::vector<float> first;
    std::string simd;
    bool identical = true;
    for (KernelVariant v : variants) {
      if (v == KernelVariant::kScalar) continue;
      ThreadPool one(1);
      perf::ExpertFfn(shape, v).Run(one, experts.data(), x.data(), out.data());
      if (first.empty()) first = out;
      identical = identical && out == first;
      absl::StrAppend(&simd, simd.empty() ? "" : ", ", KernelVariantName(v));
    }
    std::printf("%s: outputs of %s %s\n", shape.TypesName().c_str(), simd.c_str(),
                identical ? "bit-identical" : "DIFFER");
    if (!identical) return absl::InternalError("the SIMD kernel variants' outputs differ");
    int next = 0;  // the copy the next repetition reads
    for (int t : threads) {
      ThreadPool pool(t);
      for (KernelVariant v : variants) {
        perf::ExpertFfn ffn(shape, v);
        const double us = perf::MedianMicros(
            reps, [&] { ffn.Run(pool, experts.data() + (next++ % copies) * shape.bytes(), x.data(), out.data()); });
        std::printf("%-10s %10lld %-7s %8d %10.1f %8.1f\n", shape.TypesName().c_str(), (long long)shape.bytes(),
                    KernelVariantName(v), t, us, shape.bytes() / us / 1e3);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace mer

int main(int argc, char** argv) {
  const absl::Status s = mer::Main(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "expert_cpu_bench: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInternal ? 1 : 2;
  }
  return 0;
}
