// Continuous batching over a ComputeBackend: one step thread runs every step, building each
// batch from all running sequences -- first one decode token per sequence that has finished its
// prompt, then prompt tokens of the others, in arrival order, up to max_batch_tokens (so a long
// prompt is prefilled in chunks while the decodes keep flowing). Sequences join (Submit) and leave
// (finished, cancelled or failed) between steps.
//
// Output: each sequence is sampled exactly as services/compute/generation.h's Generate samples it
// alone (its own Sampler, history = prompt + output, the same positions), so on a batch-invariant
// backend (the cpu one is, bit for bit; the cuda one too up to 512 cells of context, past which
// its attention runs split-K) every sequence's tokens equal its solo output.
//
// A lone greedy decode (one running sequence past its prompt, plain argmax without logprobs,
// nothing waiting to join) runs through ComputeBackend::DecodeGreedy, which a backend may
// pipeline (the cuda one launches step i + 1 before the host has read step i's token): the same
// tokens as one step per token, at the single-process speed. It hands back to the batch loop as
// soon as another sequence is submitted, the sequence finishes or is cancelled.
//
// Admission: a sequence takes one of the backend's max_sequences slots and reserves
// prompt + max_new_tokens - 1 positions of the KV budget (kv_budget_tokens) until it leaves.
//
// Failures: a step that fails leaves the KV entries of its sequences undefined. A damaged expert
// (DataLoss) fails only the sequences routed to it: the step's sequences run again one at a time
// (RunEachAlone), so the others go on with the tokens they would have had. Any other error fails
// every sequence of the step. A lone greedy decode that fails has one sequence to fail: that one.
//
// Thread-safety: Submit, the counters and every SequenceStream method may be called from any
// thread. The backend is used by the step thread only, from the constructor to the destructor.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/compute/backend.h"
#include "services/compute/generation.h"
#include "services/compute/sampler.h"

namespace mer::compute {

class ComputeMetrics;

// The most alternatives a request may ask for with each token (OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;

struct BatcherOptions {
  // Tokens per step; 0: the backend's max_batch_tokens (also the upper limit).
  int max_batch_tokens = 0;
  // KV positions all running sequences may reserve together; 0: max_sequences *
  // max_context_tokens (every slot its full context, which is what the cpu backend allocates).
  int64_t kv_budget_tokens = 0;
  // Longest wait of Submit for a free slot and KV budget before ResourceExhausted.
  absl::Duration admission_wait = absl::Seconds(2);
  // Longest sleep of the idle step thread between heartbeats (the watchdog reads them).
  absl::Duration idle_tick = absl::Milliseconds(100);
  // Called on the step thread after every step (idle = false) and every idle tick (idle = true):
  // the one thread that may read the backend's own counters, e.g. to publish them as metrics.
  // Keep it cheap: it runs between steps.
  std::function<void(bool idle)> after_step;
};

enum class FinishReason { kNone, kLength, kStopToken };

// One sequence's output, written by the step thread and read by the caller of Submit.
class SequenceStream {
 public:
  // Waits up to `timeout` for tokens not yet taken, for the end, or for Cancel; appends the new
  // tokens to *out (and, when the request asked for them, their log-probabilities to *logprobs,
  // which may be null otherwise). Returns true once the sequence has finished and every token was
  // taken (then status() and finish_reason() are final).
  bool Next(absl::Duration timeout, std::vector<int32_t>* out, std::vector<TokenLogprobs>* logprobs = nullptr);
  // Asks the step thread to drop the sequence before its next step (frees its slot and KV), and
  // wakes a waiting Next.
  void Cancel();
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  absl::Status status() const;
  FinishReason finish_reason() const;
  int slot() const { return slot_; }

 private:
  friend class Batcher;
  explicit SequenceStream(int slot) : slot_(slot) {}
  void Push(int32_t token, const TokenLogprobs* logprobs);
  void Finish(absl::Status status, FinishReason reason);

  const int slot_;
  std::atomic<bool> cancelled_{false};
  mutable absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);          // produced, not yet taken
  std::vector<TokenLogprobs> logprobs_ ABSL_GUARDED_BY(mu_);  // theirs, when the request asks
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  FinishReason reason_ ABSL_GUARDED_BY(mu_) = FinishReason::kNone;
};

class Batcher {
 public:
  // Starts the step thread. `metrics` (may be null) outlives the batcher.
  Batcher(ComputeBackend& backend, const BatcherOptions& options, ComputeMetrics* metrics = nullptr);
  // Stops the step thread; sequences still running finish with Unavailable.
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // Checks the request (InvalidArgument naming the field: empty prompt, ids outside the
  // vocabulary, max_new_tokens < 1, prompt + output past the context, sampling out of range),
  // waits up to min(admission_wait, deadline) for a slot and KV budget (ResourceExhausted, or
  // DeadlineExceeded when the deadline came first), and queues the sequence for the next step.
  absl::StatusOr<std::shared_ptr<SequenceStream>> Submit(const GenerationRequest& request,
                                                         absl::Time deadline = absl::InfiniteFuture());

  int max_sequences() const { return max_sequences_; }
  int max_batch_tokens() const { return max_batch_tokens_; }
  int64_t kv_budget_tokens() const { return kv_budget_tokens_; }
  int free_sequences() const;
  int64_t kv_free_tokens() const;
  // When the step thread last went round its loop (for the systemd watchdog).
  absl::Time heartbeat() const;

 private:
  struct Running {
    std::shared_ptr<SequenceStream> stream;
    GenerationRequest request;
    Sampler sampler;
    std::vector<int32_t> history;  // prompt, then the output
    int32_t fed = 0;               // positions in the KV cache
    // kPrefill until its first token is sampled; kDecode while `pending` waits to be fed;
    // kFinished from the sampling that ended it to its Leave in the same step, `finished_by`
    // saying how.
    enum class Phase : uint8_t { kPrefill, kDecode, kFinished };
    Phase phase = Phase::kPrefill;
    int32_t pending = 0;  // kDecode: the last sampled token, not yet fed
    FinishReason finished_by = FinishReason::kNone;
    int32_t generated = 0;
    int64_t reserved_kv = 0;
  };

  void StepLoop();
  // One step over running_; false when there was nothing to run.
  bool Step();
  // The lone greedy decode above, when running_ allows it; false when it does not.
  bool SoloGreedyDecode();
  // After `token` was produced for r (its history, stream and count updated, with its logprobs
  // from `logits` when the request asks for them and the row's logits are there): whether it
  // ends the sequence, and how (otherwise r decodes `token` next).
  bool Finishes(Running& r, int32_t token, absl::Span<const float> logits, FinishReason* reason);
  void Leave(size_t index, absl::Status status, FinishReason reason);
  // After a batch failed with DataLoss: runs each of its sequences alone (their own tokens, the
  // same positions: the KV entries the failed step wrote are written again, and a batch-invariant
  // backend gives each the logits the batch would have), into the batch's output rows; sets
  // errors_[i] for the sequences that fail alone, i.e. that were routed to the damaged expert.
  void RunEachAlone(bool all_argmax);

  ComputeBackend& backend_;
  const BatcherOptions options_;
  ComputeMetrics* const metrics_;
  const int max_sequences_;
  const int max_batch_tokens_;
  const int64_t kv_budget_tokens_;
  const int32_t n_vocab_;

  mutable absl::Mutex mu_;
  std::vector<bool> slot_used_ ABSL_GUARDED_BY(mu_);
  int free_slots_ ABSL_GUARDED_BY(mu_);
  int64_t kv_free_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Running>> incoming_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time heartbeat_ ABSL_GUARDED_BY(mu_);

  // Step thread only.
  std::vector<std::unique_ptr<Running>> running_;
  std::vector<BatchToken> batch_;     // [max_batch_tokens]
  std::vector<int32_t> rows_;         // running_ index of each logits row
  std::vector<int32_t> prefill_n_;    // prompt tokens of running_[i] in this batch
  std::vector<float> logits_;         // f32 [max_batch_tokens, n_vocab]
  std::vector<int32_t> greedy_;       // [max_batch_tokens]: each row's argmax, when every row is greedy
  TokenLogprobs logprobs_;            // a row's, when its request asks
  std::vector<size_t> leaving_;       // running_ indices that finish in this step
  std::vector<absl::Status> errors_;  // per running_ index: why it failed in this step
  std::vector<BatchToken> alone_;     // [max_batch_tokens]: one sequence's tokens (RunEachAlone)
  size_t decode_rotation_ = 0;        // where decodes start when they do not all fit

  std::thread thread_;
};

}  // namespace mer::compute
