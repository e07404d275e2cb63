#include "services/compute/generation.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// engine.Forward into `logits`, or with `ids` engine.ForwardArgmax into `ids`.
absl::Status ForwardRows(ComputeBackend& engine, absl::Span<const BatchToken> batch, float* logits, int32_t* ids) {
  return ids != nullptr ? engine.ForwardArgmax(batch, ids) : engine.Forward(batch, logits);
}

// Feeds tokens[0, n) at positions [start, start + n) in chunks of the engine's batch size; the
// rows listed by `want_logits(i)` get logits, written consecutively to `logits`, or with `ids`
// their greedy tokens (ComputeBackend::ForwardArgmax), written consecutively to `ids`.
template <typename WantLogits>
absl::Status Feed(ComputeBackend& engine, int sequence, absl::Span<const int32_t> tokens, int32_t start,
                  const WantLogits& want_logits, float* logits, int32_t* ids = nullptr) {
  const int chunk = engine.max_batch_tokens();
  const int64_t n_vocab = engine.config().n_vocab;
  std::vector<BatchToken> batch;
  batch.reserve(chunk);
  for (size_t i0 = 0; i0 < tokens.size(); i0 += chunk) {
    batch.clear();
    int n_out = 0;
    for (size_t i = i0; i < std::min(tokens.size(), i0 + chunk); ++i) {
      const bool want = want_logits(i);
      batch.push_back({tokens[i], static_cast<int32_t>(start + i), sequence, want});
      n_out += want;
    }
    RETURN_IF_ERROR(ForwardRows(engine, batch, logits, ids));
    if (ids != nullptr)
      ids += n_out;
    else
      logits += n_out * n_vocab;
  }
  return absl::OkStatus();
}

absl::Status CheckFits(const ComputeBackend& engine, size_t tokens) {
  if (tokens > static_cast<size_t>(engine.max_context_tokens()))
    return absl::InvalidArgumentError(absl::StrCat("prompt and generation need ", tokens,
                                                   " positions; the context holds ", engine.max_context_tokens()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> Generate(ComputeBackend& engine, int sequence, const GenerationRequest& request,
                                              const std::function<void(int32_t)>& on_token, GenerationStats* stats) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (request.max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  // The last generated token is never fed back, so it needs no position.
  RETURN_IF_ERROR(CheckFits(engine, request.prompt.size() + request.max_new_tokens - 1));

  const auto t0 = std::chrono::steady_clock::now();
  engine.ClearSequence(sequence);
  const int64_t n_vocab = engine.config().n_vocab;
  Sampler sampler(request.sampling);
  // Greedy without a penalty needs no logits on the host: the backend returns the argmax.
  const bool argmax = sampler.IsPlainArgmax();
  std::vector<float> logits(argmax ? 0 : n_vocab);
  int32_t greedy = 0;  // the argmax of the last row, with `argmax`
  const size_t n_prompt = request.prompt.size();
  RETURN_IF_ERROR(Feed(
      engine, sequence, request.prompt, 0, [n_prompt](size_t i) { return i + 1 == n_prompt; }, logits.data(),
      argmax ? &greedy : nullptr));
  GenerationStats s;
  s.prompt_tokens = static_cast<int32_t>(n_prompt);
  s.prompt_seconds = SecondsSince(t0);

  std::vector<int32_t> history = request.prompt;
  history.reserve(n_prompt + request.max_new_tokens);
  std::vector<int32_t> out;
  out.reserve(request.max_new_tokens);
  std::chrono::steady_clock::time_point t_first;
  // Takes a generated token; whether generation goes on.
  const auto emit = [&](int32_t token) {
    out.push_back(token);
    history.push_back(token);
    if (out.size() == 1) {
      t_first = std::chrono::steady_clock::now();
      s.ttft_seconds = SecondsSince(t0);
    }
    if (on_token) on_token(token);
    return !request.IsStop(token) && out.size() < static_cast<size_t>(request.max_new_tokens);
  };
  if (argmax) {
    // The prompt's argmax, then each token fed back at the next position (the last one never).
    if (emit(greedy))
      RETURN_IF_ERROR(
          engine.DecodeGreedy(sequence, greedy, static_cast<int32_t>(n_prompt), request.max_new_tokens - 1, emit));
  } else {
    while (emit(sampler.Sample(logits, history))) {
      const BatchToken next{history.back(), static_cast<int32_t>(history.size() - 1), sequence, true};
      RETURN_IF_ERROR(engine.Forward(absl::MakeConstSpan(&next, 1), logits.data()));
    }
  }
  s.generated_tokens = static_cast<int32_t>(out.size());
  s.decode_seconds = SecondsSince(t_first);
  if (stats != nullptr) *stats = s;
  return out;
}

absl::Status Score(ComputeBackend& engine, int sequence, absl::Span<const int32_t> prompt,
                   absl::Span<const int32_t> continuation, float* logits) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (continuation.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckFits(engine, prompt.size() + continuation.size() - 1));
  std::vector<int32_t> all(prompt.begin(), prompt.end());
  all.insert(all.end(), continuation.begin(), continuation.end() - 1);
  engine.ClearSequence(sequence);
  const size_t first = prompt.size() - 1;
  return Feed(
      engine, sequence, all, 0, [first](size_t i) { return i >= first; }, logits);
}

}  // namespace mer
