// Time per Sampler::Sample on a Qwen3-sized vocabulary (151,936 logits, normal(0, 2)), for the
// common sampling settings. Usage: sampler_bench [DRAWS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "services/compute/sampler.h"

int main(int argc, char** argv) {
  const int draws = argc > 1 ? std::atoi(argv[1]) : 50;
  const int n = 151936;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(gen);
  struct Case {
    const char* name;
    mer::SamplingParams params;
  };
  const Case cases[] = {
      {"temperature 1", {1.0f, 0, 1.0f, 1, 1.0f}},
      {"temperature 1, top_k 40", {1.0f, 40, 1.0f, 1, 1.0f}},
      {"temperature 0.8, top_p 0.95", {0.8f, 0, 0.95f, 1, 1.0f}},
      {"temperature 0.7, top_k 40, top_p 0.9", {0.7f, 40, 0.9f, 1, 1.0f}},
  };
  for (const Case& c : cases) {
    mer::Sampler sampler(c.params);
    sampler.Sample(logits, {});  // buffers grown
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < draws; ++i) sampler.Sample(logits, {});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / draws;
    std::printf("%-40s %8.3f ms per token\n", c.name, ms);
  }
  return 0;
}
