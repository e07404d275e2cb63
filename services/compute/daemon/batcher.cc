#include "services/compute/daemon/batcher.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "services/compute/daemon/compute_metrics.h"

namespace mer::compute {

bool SequenceStream::Next(absl::Duration timeout, std::vector<int32_t>* out, std::vector<TokenLogprobs>* logprobs) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return done_ || !tokens_.empty() || cancelled_.load(std::memory_order_relaxed);
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  out->insert(out->end(), tokens_.begin(), tokens_.end());
  tokens_.clear();
  if (logprobs != nullptr) {
    for (TokenLogprobs& lp : logprobs_) logprobs->push_back(std::move(lp));
  }
  logprobs_.clear();
  return done_;
}

void SequenceStream::Cancel() {
  cancelled_.store(true, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);  // Next's condition is evaluated again on unlock
}

absl::Status SequenceStream::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

FinishReason SequenceStream::finish_reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

void SequenceStream::Push(int32_t token, const TokenLogprobs* logprobs) {
  absl::MutexLock lock(&mu_);
  tokens_.push_back(token);
  if (logprobs != nullptr) logprobs_.push_back(*logprobs);
}

void SequenceStream::Finish(absl::Status status, FinishReason reason) {
  absl::MutexLock lock(&mu_);
  done_ = true;
  status_ = std::move(status);
  reason_ = reason;
}

Batcher::Batcher(ComputeBackend& backend, const BatcherOptions& options, ComputeMetrics* metrics)
    : backend_(backend),
      options_(options),
      metrics_(metrics),
      max_sequences_(backend.max_sequences()),
      max_batch_tokens_(options.max_batch_tokens > 0 ? std::min(options.max_batch_tokens, backend.max_batch_tokens())
                                                     : backend.max_batch_tokens()),
      kv_budget_tokens_(options.kv_budget_tokens > 0 ? options.kv_budget_tokens
                                                     : int64_t(backend.max_sequences()) * backend.max_context_tokens()),
      n_vocab_(backend.config().n_vocab),
      slot_used_(backend.max_sequences(), false),
      free_slots_(backend.max_sequences()),
      kv_free_(kv_budget_tokens_),
      heartbeat_(absl::Now()) {
  running_.reserve(max_sequences_);
  batch_.reserve(max_batch_tokens_);
  rows_.reserve(max_batch_tokens_);
  prefill_n_.assign(max_sequences_, 0);
  leaving_.reserve(max_sequences_);
  errors_.reserve(max_sequences_);
  alone_.reserve(max_batch_tokens_);
  logits_.resize(size_t(max_batch_tokens_) * n_vocab_);
  greedy_.resize(max_batch_tokens_);
  for (int s = 0; s < max_sequences_; ++s) backend_.ClearSequence(s);
  thread_ = std::thread([this] { StepLoop(); });
}

Batcher::~Batcher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  const absl::Status down = absl::UnavailableError("mer-compute is shutting down");
  while (!running_.empty()) Leave(running_.size() - 1, down, FinishReason::kNone);
  absl::MutexLock lock(&mu_);
  for (auto& r : incoming_) r->stream->Finish(down, FinishReason::kNone);
  incoming_.clear();
}

absl::StatusOr<std::shared_ptr<SequenceStream>> Batcher::Submit(const GenerationRequest& request, absl::Time deadline) {
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt: empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    const int32_t id = request.prompt[i];
    if (id < 0 || id >= n_vocab_)
      return absl::InvalidArgumentError(
          absl::StrCat("prompt: token ", id, " at index ", i, " is outside the vocabulary [0, ", n_vocab_, ")"));
  }
  if (request.max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens: must be >= 1");
  if (auto s = ValidateSamplingParams(request.sampling); !s.ok()) return s;
  for (const auto& [id, bias] : request.sampling.logit_bias) {
    if (id >= n_vocab_)
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: token ", id, " is outside the vocabulary [0, ", n_vocab_, ")"));
  }
  if (request.top_logprobs > kMaxTopLogprobs)
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs: at most ", kMaxTopLogprobs, ", got ", request.top_logprobs));
  // The last generated token is never fed back, so it needs no position.
  const int64_t need = int64_t(request.prompt.size()) + request.max_new_tokens - 1;
  if (need > backend_.max_context_tokens())
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens: prompt (", request.prompt.size(), " tokens) + max_new_tokens (", request.max_new_tokens,
        ") - 1 = ", need, " positions; the context holds ", backend_.max_context_tokens()));
  if (need > kv_budget_tokens_)
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens: the sequence needs ", need, " KV positions; the budget is ", kv_budget_tokens_));

  auto r = std::make_unique<Running>(Running{
      nullptr, request, Sampler(request.sampling), {}, 0, Running::Phase::kPrefill, 0, FinishReason::kNone, 0, need});
  r->history.reserve(request.prompt.size() + request.max_new_tokens);
  r->history = request.prompt;

  const absl::Time until = std::min(deadline, absl::Now() + options_.admission_wait);
  absl::MutexLock lock(&mu_);
  auto admissible = [this, need]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || (free_slots_ > 0 && kv_free_ >= need); };
  if (!mu_.AwaitWithDeadline(absl::Condition(&admissible), until)) {
    if (deadline <= until) return absl::DeadlineExceededError("deadline passed waiting for a sequence slot");
    return absl::ResourceExhaustedError(absl::StrCat("no free sequence slot or KV budget (", free_slots_, " of ",
                                                     max_sequences_, " slots free, ", kv_free_, " of ",
                                                     kv_budget_tokens_, " KV positions free, ", need, " needed)"));
  }
  if (stop_) return absl::UnavailableError("mer-compute is shutting down");
  int slot = 0;
  while (slot_used_[slot]) ++slot;
  slot_used_[slot] = true;
  --free_slots_;
  kv_free_ -= need;
  r->stream = std::shared_ptr<SequenceStream>(new SequenceStream(slot));
  std::shared_ptr<SequenceStream> stream = r->stream;
  incoming_.push_back(std::move(r));
  return stream;
}

int Batcher::free_sequences() const {
  absl::MutexLock lock(&mu_);
  return free_slots_;
}

int64_t Batcher::kv_free_tokens() const {
  absl::MutexLock lock(&mu_);
  return kv_free_;
}

absl::Time Batcher::heartbeat() const {
  absl::MutexLock lock(&mu_);
  return heartbeat_;
}

void Batcher::StepLoop() {
  for (;;) {
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      heartbeat_ = absl::Now();
      if (stop_) return;
      if (running_.empty() && incoming_.empty()) {
        auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !incoming_.empty(); };
        mu_.AwaitWithTimeout(absl::Condition(&wake), options_.idle_tick);
        idle = true;
      } else {
        while (!incoming_.empty()) {
          running_.push_back(std::move(incoming_.front()));
          incoming_.pop_front();
        }
      }
    }
    if (!idle && !SoloGreedyDecode()) Step();
    if (options_.after_step) options_.after_step(idle);
  }
}

bool Batcher::Finishes(Running& r, int32_t token, absl::Span<const float> logits, FinishReason* reason) {
  r.history.push_back(token);
  ++r.generated;
  const bool logprobs = r.request.top_logprobs >= 0 && !logits.empty();
  if (logprobs) Sampler::Logprobs(logits, token, r.request.top_logprobs, &logprobs_);
  r.stream->Push(token, logprobs ? &logprobs_ : nullptr);
  if (r.request.IsStop(token)) {
    *reason = FinishReason::kStopToken;
    return true;
  }
  if (r.generated == r.request.max_new_tokens) {
    *reason = FinishReason::kLength;
    return true;
  }
  r.phase = Running::Phase::kDecode;
  r.pending = token;
  return false;
}

bool Batcher::SoloGreedyDecode() {
  if (running_.size() != 1) return false;
  Running& r = *running_[0];
  if (r.phase != Running::Phase::kDecode || !r.sampler.IsPlainArgmax() || r.request.top_logprobs >= 0 ||
      r.stream->cancelled())
    return false;
  {
    absl::MutexLock lock(&mu_);
    if (!incoming_.empty() || stop_) return false;
  }
  auto t_last = std::chrono::steady_clock::now();
  FinishReason reason = FinishReason::kNone;
  const int32_t first_position = r.fed;
  const absl::Status s = backend_.DecodeGreedy(
      r.stream->slot(), r.pending, r.fed, r.request.max_new_tokens - r.generated, [&](int32_t token) {
        ++r.fed;  // the token fed for this step is in the KV cache now
        const bool done = Finishes(r, token, {}, &reason);
        const auto now = std::chrono::steady_clock::now();
        if (metrics_ != nullptr) metrics_->OnStep(std::chrono::duration<double>(now - t_last).count(), 1, 1, 0, 1);
        t_last = now;
        if (options_.after_step) options_.after_step(false);
        bool join;
        {
          absl::MutexLock lock(&mu_);
          heartbeat_ = absl::Now();
          join = !incoming_.empty() || stop_;
        }
        return !done && !join && !r.stream->cancelled();
      });
  if (!s.ok()) {
    Leave(0, absl::Status(s.code(), absl::StrCat("forward pass: ", s.message())), FinishReason::kNone);
    return true;
  }
  if (r.fed == first_position) return false;  // no step ran: let the batch loop take it
  if (reason != FinishReason::kNone) Leave(0, absl::OkStatus(), reason);
  return true;
}

void Batcher::Leave(size_t index, absl::Status status, FinishReason reason) {
  std::unique_ptr<Running> r = std::move(running_[index]);
  running_.erase(running_.begin() + index);
  const int slot = r->stream->slot();
  backend_.ClearSequence(slot);
  if (metrics_ != nullptr) metrics_->OnSequenceEnd(status, r->generated);
  {
    absl::MutexLock lock(&mu_);
    slot_used_[slot] = false;
    ++free_slots_;
    kv_free_ += r->reserved_kv;
  }
  r->stream->Finish(std::move(status), reason);
}

bool Batcher::Step() {
  // Cancelled sequences leave before anything of theirs runs again.
  for (size_t i = running_.size(); i-- > 0;) {
    if (running_[i]->stream->cancelled_.load(std::memory_order_relaxed))
      Leave(i, absl::CancelledError("cancelled"), FinishReason::kNone);
  }
  if (running_.empty()) return false;

  const auto t0 = std::chrono::steady_clock::now();
  batch_.clear();
  rows_.clear();
  int budget = max_batch_tokens_;
  // Decodes first: one token each, starting at a rotating index when they do not all fit.
  const size_t n = running_.size();
  std::fill(prefill_n_.begin(), prefill_n_.end(), 0);
  const size_t start = decode_rotation_ % n;
  int decodes = 0;
  for (size_t k = 0; k < n && budget > 0; ++k) {
    const size_t i = (start + k) % n;
    Running& r = *running_[i];
    if (r.phase != Running::Phase::kDecode) continue;
    batch_.push_back({r.pending, r.fed, r.stream->slot(), true});
    rows_.push_back(static_cast<int32_t>(i));
    --budget;
    ++decodes;
  }
  if (decodes > 0 && budget == 0) decode_rotation_ += decodes;
  // Then prompt chunks, in arrival order.
  int prompt_tokens = 0;
  for (size_t i = 0; i < n && budget > 0; ++i) {
    Running& r = *running_[i];
    if (r.phase != Running::Phase::kPrefill) continue;
    const int32_t prompt_len = static_cast<int32_t>(r.request.prompt.size());
    const int take = std::min<int>(budget, prompt_len - r.fed);
    for (int j = 0; j < take; ++j) {
      const int32_t pos = r.fed + j;
      const bool last = pos + 1 == prompt_len;
      batch_.push_back({r.request.prompt[pos], pos, r.stream->slot(), last});
      if (last) rows_.push_back(static_cast<int32_t>(i));
    }
    prefill_n_[i] = take;
    budget -= take;
    prompt_tokens += take;
  }

  // Rows must be in batch order: decodes (in rotation order) come first, then the prompts' last
  // tokens in arrival order, which is how they were appended. When every row samples greedily
  // without a penalty, the backend returns the argmaxes and no logits reach the host.
  bool all_argmax = true;
  for (int32_t i : rows_) {
    const Running& r = *running_[i];
    all_argmax = all_argmax && r.sampler.IsPlainArgmax() && r.request.top_logprobs < 0;
  }
  const absl::Status s =
      all_argmax ? backend_.ForwardArgmax(batch_, greedy_.data()) : backend_.Forward(batch_, logits_.data());
  errors_.assign(n, absl::OkStatus());
  if (!s.ok()) {
    // Every sequence in the batch has undefined KV entries now. A damaged expert (DataLoss) is
    // needed by some of them only: each runs again alone, and only those that need it fail.
    // Any other error (mer-residency gone: Unavailable) fails them all. The others keep running.
    size_t in_batch = 0;
    for (size_t i = 0; i < n; ++i) in_batch += running_[i]->phase == Running::Phase::kDecode || prefill_n_[i] > 0;
    if (absl::IsDataLoss(s) && in_batch > 1) {
      RunEachAlone(all_argmax);
    } else {
      for (size_t i = 0; i < n; ++i) {
        if (running_[i]->phase == Running::Phase::kDecode || prefill_n_[i] > 0) errors_[i] = s;
      }
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (running_[i]->phase == Running::Phase::kPrefill && errors_[i].ok()) running_[i]->fed += prefill_n_[i];
  }
  // Sample; then advance, finish or keep each sequence with a logits row.
  std::vector<size_t>& leaving = leaving_;
  leaving.clear();
  for (size_t i = 0; i < n; ++i) {
    if (!errors_[i].ok()) leaving.push_back(i);
  }
  for (size_t row = 0; row < rows_.size(); ++row) {
    if (!errors_[rows_[row]].ok()) continue;
    Running& r = *running_[rows_[row]];
    if (r.phase == Running::Phase::kDecode) ++r.fed;  // the decode token is in the KV cache now
    const float* lg = logits_.data() + row * size_t(n_vocab_);
    const absl::Span<const float> row_logits = absl::MakeConstSpan(lg, n_vocab_);
    const int32_t token = all_argmax ? greedy_[row] : r.sampler.Sample(row_logits, r.history);
    FinishReason reason;
    if (Finishes(r, token, all_argmax ? absl::Span<const float>() : row_logits, &reason)) {
      leaving.push_back(rows_[row]);
      r.phase = Running::Phase::kFinished;  // read back below
      r.finished_by = reason;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (metrics_ != nullptr)
    metrics_->OnStep(seconds, static_cast<int>(batch_.size()), static_cast<int>(n), prompt_tokens,
                     static_cast<int>(rows_.size()));
  std::sort(leaving.begin(), leaving.end());
  for (size_t k = leaving.size(); k-- > 0;) {
    const size_t i = leaving[k];
    if (const absl::Status& e = errors_[i]; !e.ok()) {
      Leave(i, absl::Status(e.code(), absl::StrCat("forward pass: ", e.message())), FinishReason::kNone);
      continue;
    }
    Leave(i, absl::OkStatus(), running_[i]->finished_by);
  }
  return true;
}

void Batcher::RunEachAlone(bool all_argmax) {
  for (size_t i = 0; i < running_.size(); ++i) {
    const Running& r = *running_[i];
    if (r.phase != Running::Phase::kDecode && prefill_n_[i] == 0) continue;  // not in this batch
    // Its tokens, in batch order, and the row of its logits in the batch's output (rows are the
    // batch's want_logits tokens in order; a sequence has at most one).
    alone_.clear();
    size_t rows_before = 0, row = 0;
    for (const BatchToken& t : batch_) {
      if (t.sequence == r.stream->slot()) {
        if (t.want_logits) row = rows_before;
        alone_.push_back(t);
      }
      if (t.want_logits) ++rows_before;
    }
    errors_[i] = all_argmax ? backend_.ForwardArgmax(alone_, greedy_.data() + row)
                            : backend_.Forward(alone_, logits_.data() + row * size_t(n_vocab_));
  }
}

}  // namespace mer::compute
