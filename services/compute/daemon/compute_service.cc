#include "services/compute/daemon/compute_service.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "proto/grpc_status.h"

namespace mer::compute {

namespace pb = mer::internal::v1;

ComputeService::ComputeService(Batcher& batcher, pb::Info info, pb::TokenizerVocab vocab,
                               const ComputeServiceOptions& options)
    : batcher_(batcher), info_(std::move(info)), vocab_(std::move(vocab)), options_(options) {
  watcher_ = std::thread([this] { WatchLoop(); });
}

ComputeService::~ComputeService() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  watcher_.join();
}

void ComputeService::WatchLoop() {
  absl::MutexLock lock(&mu_);
  for (;;) {
    // Idle (no calls): sleep until one comes; else look every cancel_poll.
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    auto busy = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !watched_.empty(); };
    if (watched_.empty()) mu_.Await(absl::Condition(&busy));
    mu_.AwaitWithTimeout(absl::Condition(&wake), options_.cancel_poll);
    if (stop_) return;
    for (auto& [id, w] : watched_) {
      if (!w.second->cancelled() && w.first->IsCancelled()) w.second->Cancel();
    }
  }
}

grpc::Status ComputeService::Generate(grpc::ServerContext* context, const pb::GenerateRequest* request,
                                      grpc::ServerWriter<pb::GenerateResponse>* writer) {
  if (options_.serving) {
    if (const absl::Status s = options_.serving(); !s.ok()) return ToGrpcStatus(s);
  }
  GenerationRequest req;
  req.prompt.assign(request->prompt().begin(), request->prompt().end());
  req.max_new_tokens = request->max_new_tokens();
  req.stop_ids.assign(request->stop_token_ids().begin(), request->stop_token_ids().end());
  req.top_logprobs = request->logprobs() ? request->top_logprobs() : -1;
  const pb::Sampling& s = request->sampling();
  req.sampling.temperature = s.temperature();
  req.sampling.top_k = s.top_k();
  req.sampling.top_p = s.top_p();
  req.sampling.seed = s.seed();
  req.sampling.repetition_penalty = s.repetition_penalty();
  req.sampling.min_p = s.min_p();
  req.sampling.presence_penalty = s.presence_penalty();
  req.sampling.frequency_penalty = s.frequency_penalty();
  req.sampling.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(req.sampling.logit_bias.begin(), req.sampling.logit_bias.end());  // a map's order is not fixed
  const absl::Time deadline = absl::FromChrono(context->deadline());

  absl::StatusOr<std::shared_ptr<SequenceStream>> submitted = batcher_.Submit(req, deadline);
  if (!submitted.ok()) return ToGrpcStatus(submitted.status());
  const std::shared_ptr<SequenceStream> stream = std::move(*submitted);
  uint64_t watch;
  {
    absl::MutexLock lock(&mu_);
    watch = next_watch_++;
    watched_[watch] = {context, stream};
  }
  struct Unwatch {
    ComputeService* self;
    uint64_t id;
    ~Unwatch() {
      absl::MutexLock lock(&self->mu_);
      self->watched_.erase(id);
    }
  } unwatch{this, watch};
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  pb::GenerateResponse response;
  for (;;) {
    tokens.clear();
    logprobs.clear();
    const bool done = stream->Next(
        std::min(options_.deadline_poll, std::max(absl::ZeroDuration(), deadline - absl::Now())), &tokens, &logprobs);
    if (!tokens.empty()) {
      response.Clear();
      response.mutable_token_ids()->Add(tokens.begin(), tokens.end());
      for (const TokenLogprobs& lp : logprobs) {
        pb::TokenLogprob* out = response.add_logprobs();
        out->set_logprob(lp.logprob);
        out->mutable_top_ids()->Add(lp.top_ids.begin(), lp.top_ids.end());
        out->mutable_top_logprobs()->Add(lp.top_logprobs.begin(), lp.top_logprobs.end());
      }
      if (!writer->Write(response)) {
        stream->Cancel();
        return grpc::Status(grpc::StatusCode::CANCELLED, "the caller is gone");
      }
    }
    if (done) {
      const absl::Status status = stream->status();
      if (!status.ok()) return ToGrpcStatus(status);
      response.Clear();
      response.set_done(true);
      response.set_finish_reason(stream->finish_reason() == FinishReason::kStopToken ? pb::FINISH_REASON_STOP_TOKEN
                                                                                     : pb::FINISH_REASON_LENGTH);
      writer->Write(response);
      return grpc::Status::OK;
    }
    if (stream->cancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the caller");
    if (absl::Now() >= deadline) {
      stream->Cancel();
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
    }
  }
}

grpc::Status ComputeService::GetInfo(grpc::ServerContext*, const pb::GetInfoRequest*, pb::Info* response) {
  *response = info_;
  response->set_max_sequences(batcher_.max_sequences());
  response->set_max_batch_tokens(batcher_.max_batch_tokens());
  response->set_free_sequences(batcher_.free_sequences());
  response->set_kv_budget_tokens(batcher_.kv_budget_tokens());
  response->set_kv_free_tokens(batcher_.kv_free_tokens());
  if (options_.serving) {
    if (const absl::Status s = options_.serving(); !s.ok()) response->set_unavailable(std::string(s.message()));
  }
  return grpc::Status::OK;
}

grpc::Status ComputeService::GetTokenizer(grpc::ServerContext*, const pb::GetTokenizerRequest*,
                                          pb::TokenizerVocab* response) {
  *response = vocab_;
  return grpc::Status::OK;
}

}  // namespace mer::compute
