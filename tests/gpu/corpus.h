// What the GPU engine tests share: a fixed corpus of prompts, greedy generation and teacher-forced
// logits over it, and the relative L2 distance the logits are bounded by.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "services/compute/backend.h"
#include "services/compute/generation.h"

namespace mer::gpu_test {

// n_prompts prompts of n_tokens ids in [0, n_vocab), from a 64-bit LCG seeded with `seed`.
inline std::vector<std::vector<int32_t>> Corpus(int n_prompts, int n_tokens, int n_vocab, uint64_t seed) {
  std::vector<std::vector<int32_t>> prompts;
  uint64_t s = seed;
  for (int p = 0; p < n_prompts; ++p) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n_tokens; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      ids.push_back(static_cast<int32_t>((s >> 33) % n_vocab));
    }
    prompts.push_back(ids);
  }
  return prompts;
}

// n_gen greedy ids after `prompt` (sequence 0); a failure is reported and gives n_gen ids of -1.
inline std::vector<int32_t> GreedyIds(ComputeBackend& engine, const std::vector<int32_t>& prompt, int n_gen) {
  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = n_gen;
  auto ids = Generate(engine, 0, req, {});
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>(n_gen, -1);
}

// The logits of every step with `cont` forced after `prompt`: [cont.size(), n_vocab].
inline std::vector<float> ForcedLogits(ComputeBackend& engine, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& cont) {
  std::vector<float> logits(cont.size() * engine.config().n_vocab);
  const absl::Status s = Score(engine, 0, prompt, cont, logits.data());
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

// Greedy ids of every prompt (n_gen each), then each prompt's teacher-forced logits over
// `forced`'s ids (or over these ids when forced is null).
struct Outputs {
  std::vector<std::vector<int32_t>> ids;
  std::vector<std::vector<float>> logits;
};

inline Outputs GreedyAndScore(ComputeBackend& engine, const std::vector<std::vector<int32_t>>& prompts, int n_gen,
                              const Outputs* forced) {
  Outputs r;
  for (const auto& prompt : prompts) r.ids.push_back(GreedyIds(engine, prompt, n_gen));
  for (size_t p = 0; p < prompts.size(); ++p)
    r.logits.push_back(ForcedLogits(engine, prompts[p], forced != nullptr ? forced->ids[p] : r.ids[p]));
  return r;
}

inline double RelL2(const float* a, const float* b, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The cuda backend's outputs against the reference's (both from GreedyAndScore, `ref` forced): the
// greedy ids must be equal and every step's logits within `bound` relative L2 (gtest failures,
// labelled with `what`). Counts the id mismatches and the worst relative L2 into *c. A prompt
// whose id count differs is a fatal failure in the caller (check HasFatalFailure()).
struct ReferenceComparison {
  int id_mismatches = 0;
  double worst_rel_l2 = 0;
};

inline void CompareWithReference(const Outputs& got, const Outputs& ref, int n_vocab, double bound,
                                 const std::string& what, ReferenceComparison* c) {
  ASSERT_EQ(got.ids.size(), ref.ids.size()) << what;
  for (size_t p = 0; p < ref.ids.size(); ++p) {
    ASSERT_EQ(got.ids[p].size(), ref.ids[p].size()) << what << " prompt " << p;
    const size_t n = ref.ids[p].size();
    for (size_t i = 0; i < n; ++i) c->id_mismatches += got.ids[p][i] != ref.ids[p][i];
    EXPECT_EQ(got.ids[p], ref.ids[p]) << what << " prompt " << p;
    for (size_t i = 0; i < n; ++i) {
      const double e = RelL2(&got.logits[p][int64_t(i) * n_vocab], &ref.logits[p][int64_t(i) * n_vocab], n_vocab);
      c->worst_rel_l2 = std::max(c->worst_rel_l2, e);
      EXPECT_LE(e, bound) << what << " prompt " << p << " step " << i;
    }
  }
}

}  // namespace mer::gpu_test
