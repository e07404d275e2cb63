// One routed expert's SwiGLU feed-forward for one token on the CPU, for the benchmarks that ask
// what a missed expert costs there (tests/perf/expert_cpu_bench.cc, tests/gpu/miss_path_bench.cc).
// Computed as the CPU engine computes it (services/compute/cpu/cpu_engine.cc): the token's
// activation converted for the gate/up type, gate and up in 32-row chunks over the thread pool,
// SwiGLU, the result converted for the down type, down in 32-row chunks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/quant/kernel_variant.h"
#include "common/tensor/ggml_type.h"
#include "services/compute/cpu/thread_pool.h"

namespace mer::perf {

// An expert's geometry and tensor types: gate and up [ff rows x embd columns], down [embd x ff],
// row-major, laid out gate | up | down (as in an expert store's blob, without its padding).
struct ExpertShape {
  int64_t embd = 2048;  // d_model (Qwen3-30B-A3B)
  int64_t ff = 768;     // expert FFN width
  GgmlType gate_up_type = GgmlType::kQ8_0;
  GgmlType down_type = GgmlType::kQ8_0;

  int64_t gate_bytes() const { return ff * RowBytes(gate_up_type, embd); }
  int64_t down_bytes() const { return embd * RowBytes(down_type, ff); }
  int64_t bytes() const { return 2 * gate_bytes() + down_bytes(); }
  // "q8_0", "q4_k", or "q4_k+q6_k" (gate/up type + down type).
  std::string TypesName() const;
};

// Parses "q8_0", "q4_k" (all three Q4_K) or "GATE_UP+DOWN" such as "q4_k+q6_k" (llama.cpp's
// Q4_K_M gives half the layers' down projections Q6_K) into shape's types: F16, BF16, Q8_0, Q4_K
// or Q6_K, whose blocks must divide the rows of the geometry.
absl::Status ParseExpertTypes(const std::string& spec, ExpertShape* shape);

// Writes one expert of random weights (normal, sd 0.05, quantized by QuantizeRow) at dst, then
// copies it to the next copies - 1 slots of shape.bytes() each: enough distinct memory that a
// benchmark cycling through the copies reads its weights from DRAM, as from a RAM tier.
void WriteRandomExperts(const ExpertShape& shape, int copies, uint32_t seed, uint8_t* dst);

class ExpertFfn {
 public:
  // Dot products by the given kernel variant (VecDotRowsWith), which the CPU must support.
  ExpertFfn(const ExpertShape& shape, KernelVariant kernels);

  // out [embd] = down(SwiGLU(gate x, up x)) for one token x [embd], the expert at `expert`.
  void Run(ThreadPool& pool, const uint8_t* expert, const float* x, float* out);

 private:
  ExpertShape shape_;
  KernelVariant kernels_;
  std::vector<uint8_t> x_act_;    // x converted for gate/up
  std::vector<uint8_t> h_act_;    // SwiGLU result converted for down
  std::vector<float> gate_, up_;  // f32 [ff]
};

// Median wall time of `reps` calls of fn, in microseconds, after one call to warm up.
template <typename Fn>
double MedianMicros(int reps, const Fn& fn) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> t;
  fn();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace mer::perf
