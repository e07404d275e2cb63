// Which way to serve a VRAM miss on this host (../DESIGN.md "the warm loop"): upload the expert
// from the RAM tier over PCIe, or compute it on the CPU where it already lies. Both for one
// decode token and one expert of the given geometry (default Qwen3-30B-A3B, Q8_0: gate and up
// [ff, embd], down [embd, ff]), measured side by side in one process, medians of --reps. Each
// repetition takes the next of 64 copies of the expert (320 MB at the default geometry), so the
// weights come from DRAM, as from a RAM tier, not from the CPU's caches:
//   upload       the expert's three matrices H2D with cudaMemcpyAsync from pinned (and pageable)
//                host memory, then a stream sync;
//   cpu N        gate/up row dots, SwiGLU, the Q8_0 conversion and the down row dots with the CPU
//                engine's kernels on N threads (the same floats as the GPU; cpu_ops.h);
//   round trip   what the CPU path adds on the GPU side: the token's activation D2H and the
//                expert's output H2D (f32 rows), with a sync each way.
// Usage: miss_path_bench [--embd 2048] [--ff 768] [--reps 50]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/quant/q8_0.h"
#include "services/compute/cpu/cpu_ops.h"
#include "services/compute/cpu/thread_pool.h"
#include "services/compute/cuda/cuda_check.cuh"

namespace mer {
namespace {

using Clock = std::chrono::steady_clock;

template <typename Fn>
double MedianMicros(int reps, const Fn& fn) {
  std::vector<double> t;
  fn();  // warm-up
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<BlockQ8_0> RandomQ8_0(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> row(cols);
  std::vector<BlockQ8_0> out(rows * cols / 32);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = d(rng);
    QuantizeRowQ8_0Reference(row.data(), &out[r * cols / 32], cols);
  }
  return out;
}

int Main(int argc, char** argv) {
  int64_t embd = 2048, ff = 768;
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--embd") embd = std::atoll(argv[i + 1]);
    else if (f == "--ff") ff = std::atoll(argv[i + 1]);
    else if (f == "--reps") reps = std::atoi(argv[i + 1]);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "miss_path_bench: no CUDA device\n");
    return 77;
  }
  std::mt19937 rng(7);
  const std::vector<BlockQ8_0> gate = RandomQ8_0(ff, embd, rng), up = RandomQ8_0(ff, embd, rng),
                               down = RandomQ8_0(embd, ff, rng);
  const int64_t gate_bytes = gate.size() * sizeof(BlockQ8_0), down_bytes = down.size() * sizeof(BlockQ8_0);
  const int64_t expert_bytes = 2 * gate_bytes + down_bytes;
  constexpr int kCopies = 64;
  int next = 0;  // the copy the next repetition reads
  std::printf("expert: gate/up %lld x %lld, down %lld x %lld, Q8_0, %lld bytes\n", (long long)ff,
              (long long)embd, (long long)embd, (long long)ff, (long long)expert_bytes);

  // Upload: from pinned and from pageable host memory.
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint8_t* dev = nullptr;
  CUDA_CHECK(cudaMalloc(&dev, expert_bytes));
  uint8_t* pinned = nullptr;
  CUDA_CHECK(cudaMallocHost(&pinned, expert_bytes * kCopies));
  std::vector<uint8_t> pageable(expert_bytes * kCopies);
  for (int c = 0; c < kCopies; ++c) {
    uint8_t* e = pinned + c * expert_bytes;
    std::memcpy(e, gate.data(), gate_bytes);
    std::memcpy(e + gate_bytes, up.data(), gate_bytes);
    std::memcpy(e + 2 * gate_bytes, down.data(), down_bytes);
  }
  std::memcpy(pageable.data(), pinned, expert_bytes * kCopies);
  const auto upload = [&](const uint8_t* src) {
    const int64_t off[3] = {0, gate_bytes, 2 * gate_bytes}, len[3] = {gate_bytes, gate_bytes, down_bytes};
    for (int i = 0; i < 3; ++i)
      CUDA_CHECK(cudaMemcpyAsync(dev + off[i], src + off[i], len[i], cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  const double up_pinned = MedianMicros(reps, [&] { upload(pinned + (next++ % kCopies) * expert_bytes); });
  const double up_pageable =
      MedianMicros(reps, [&] { upload(pageable.data() + (next++ % kCopies) * expert_bytes); });
  std::printf("upload pinned    %8.1f us  (%.1f GB/s)\n", up_pinned, expert_bytes / up_pinned / 1e3);
  std::printf("upload pageable  %8.1f us  (%.1f GB/s)\n", up_pageable, expert_bytes / up_pageable / 1e3);

  // The CPU path's extra GPU traffic: activation down, output up.
  float* host_rows = nullptr;
  CUDA_CHECK(cudaMallocHost(&host_rows, embd * 4 * 2));
  const double round_trip = MedianMicros(reps, [&] {
    CUDA_CHECK(cudaMemcpyAsync(host_rows, dev, embd * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpyAsync(dev, host_rows + embd, embd * 4, cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  });
  std::printf("round trip       %8.1f us  (activation D2H + output H2D, %lld floats each)\n", round_trip,
              (long long)embd);

  // CPU compute of the expert for one token.
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(embd);
  for (float& v : x) v = d(rng);
  std::vector<BlockQ8_0> xq(embd / 32), hq(ff / 32);
  std::vector<float> g(ff), u(ff), out(embd);
  for (int threads : {1, 2, 4, 8, 16}) {
    ThreadPool pool(threads);
    const auto compute = [&] {
      const uint8_t* e = pinned + (next++ % kCopies) * expert_bytes;
      const BlockQ8_0* gate_w = reinterpret_cast<const BlockQ8_0*>(e);
      const BlockQ8_0* up_w = reinterpret_cast<const BlockQ8_0*>(e + gate_bytes);
      const BlockQ8_0* down_w = reinterpret_cast<const BlockQ8_0*>(e + 2 * gate_bytes);
      QuantizeRowQ8_0(x.data(), xq.data(), embd);
      pool.ParallelFor(2 * ff, 64, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
          const bool is_up = r >= ff;
          const int64_t row = is_up ? r - ff : r;
          VecDotRowsQ8_0((is_up ? up_w : gate_w) + row * embd / 32, 1, xq.data(), embd, &(is_up ? u : g)[row]);
        }
      });
      cpu::SwiGlu(g.data(), u.data(), ff);
      QuantizeRowQ8_0(g.data(), hq.data(), ff);
      pool.ParallelFor(embd, 64, [&](int64_t b, int64_t end) {
        VecDotRowsQ8_0(down_w + b * ff / 32, end - b, hq.data(), ff, &out[b]);
      });
    };
    const double t = MedianMicros(reps, compute);
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
