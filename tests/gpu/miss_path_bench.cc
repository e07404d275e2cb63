// Which way to serve a VRAM miss on this host (../DESIGN.md "the warm loop"): upload the expert
// from the RAM tier over PCIe, or compute it on the CPU where it already lies. Both for one
// decode token and one expert of the given geometry (default Qwen3-30B-A3B: gate and up
// [ff, embd], down [embd, ff]) and types (default Q8_0; tests/perf/expert_ffn.h), measured side by
// side in one process, medians of --reps. Each repetition takes the next of 64 copies of the
// expert (320 MB at the default geometry in Q8_0), so the weights come from DRAM, as from a RAM
// tier, not from the CPU's caches:
//   upload       the expert's three matrices H2D with cudaMemcpyAsync from pinned (and pageable)
//                host memory, then a stream sync;
//   cpu N        the expert's SwiGLU as the CPU engine computes it (tests/perf/expert_ffn.h) on N
//                threads, with the CPU kernel variant chosen at run time (MER_CPU_KERNELS forces
//                one; tests/perf/expert_cpu_bench compares variants);
//   round trip   what the CPU path adds on the GPU side: the token's activation D2H and the
//                expert's output H2D (f32 rows), with a sync each way.
// Usage: miss_path_bench [--embd 2048] [--ff 768] [--types q8_0] [--reps 50]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/quant/kernel_variant.h"
#include "services/compute/cpu/thread_pool.h"
#include "services/compute/cuda/cuda_check.cuh"
#include "tests/perf/expert_ffn.h"

namespace mer {
namespace {

int Main(int argc, char** argv) {
  perf::ExpertShape shape;
  std::string types = "q8_0";
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--embd")
      shape.embd = std::atoll(argv[i + 1]);
    else if (f == "--ff")
      shape.ff = std::atoll(argv[i + 1]);
    else if (f == "--types")
      types = argv[i + 1];
    else if (f == "--reps")
      reps = std::atoi(argv[i + 1]);
  }
  const absl::Status parsed = perf::ParseExpertTypes(types, &shape);
  const absl::StatusOr<std::string> kernels = DescribeKernelVariant();
  if (!parsed.ok() || !kernels.ok()) {
    std::fprintf(stderr, "miss_path_bench: %s\n",
                 std::string((parsed.ok() ? kernels.status() : parsed).message()).c_str());
    return 2;
  }
  const int64_t embd = shape.embd;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "miss_path_bench: no CUDA device\n");
    return 77;
  }
  const int64_t gate_bytes = shape.gate_bytes(), down_bytes = shape.down_bytes();
  const int64_t expert_bytes = shape.bytes();
  constexpr int kCopies = 64;
  int next = 0;  // the copy the next repetition reads
  std::printf("expert: gate/up %lld x %lld, down %lld x %lld, %s, %lld bytes; cpu kernels %s\n", (long long)shape.ff,
              (long long)embd, (long long)embd, (long long)shape.ff, shape.TypesName().c_str(), (long long)expert_bytes,
              kernels->c_str());

  // Upload: from pinned and from pageable host memory.
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint8_t* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, expert_bytes));
  uint8_t* pinned = nullptr;
  CUDA_CHECK(cudaMallocHost(&pinned, expert_bytes * kCopies));
  std::vector<uint8_t> pageable(expert_bytes * kCopies);
  perf::WriteRandomExperts(shape, kCopies, 7, pinned);
  std::memcpy(pageable.data(), pinned, expert_bytes * kCopies);
  const auto upload = [&](const uint8_t* src) {
    const int64_t off[3] = {0, gate_bytes, 2 * gate_bytes}, len[3] = {gate_bytes, gate_bytes, down_bytes};
    for (int i = 0; i < 3; ++i)
      CUDA_CHECK(cudaMemcpyAsync(dev + off[i], src + off[i], len[i], cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  const double up_pinned = perf::MedianMicros(reps, [&] { upload(pinned + (next++ % kCopies) * expert_bytes); });
  const double up_pageable =
      perf::MedianMicros(reps, [&] { upload(pageable.data() + (next++ % kCopies) * expert_bytes); });
  std::printf("upload pinned    %8.1f us  (%.1f GB/s)\n", up_pinned, expert_bytes / up_pinned / 1e3);
  std::printf("upload pageable  %8.1f us  (%.1f GB/s)\n", up_pageable, expert_bytes / up_pageable / 1e3);

  // The CPU path's extra GPU traffic: activation down, output up.
  float* host_rows = nullptr;
  CUDA_CHECK(cudaMallocHost(&host_rows, embd * 4 * 2));
  const double round_trip = perf::MedianMicros(reps, [&] {
    CUDA_CHECK(cudaMemcpyAsync(host_rows, dev, embd * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpyAsync(dev, host_rows + embd, embd * 4, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  });
  std::printf("round trip       %8.1f us  (activation D2H + output H2D, %lld floats each)\n", round_trip,
              (long long)embd);

  // CPU compute of the expert for one token.
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(embd), out(embd);
  for (float& v : x) v = d(rng);
  perf::ExpertFfn ffn(shape, ActiveKernelVariant());
  for (int threads : {1, 2, 4, 8, 16}) {
    ThreadPool pool(threads);
    const double t = perf::MedianMicros(
        reps, [&] { ffn.Run(pool, pinned + (next++ % kCopies) * expert_bytes, x.data(), out.data()); });
    std::printf("cpu %2d threads   %8.1f us  (%.1f GB/s of weights)%s\n", threads, t, expert_bytes / t / 1e3,
                t + round_trip < up_pinned ? "  faster than the pinned upload" : "");
  }
  CUDA_CHECK(cudaFreeHost(host_rows));
  CUDA_CHECK(cudaFreeHost(pinned));
  CUDA_CHECK(cudaFree(dev));
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}

}  // namespace
}  // namespace mer

int main(int argc, char** argv) { return mer::Main(argc, argv); }
