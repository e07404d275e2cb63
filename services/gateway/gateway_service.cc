#include "services/gateway/gateway_service.h"

#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"
#include "services/gateway/text_stream.h"

namespace mer::gateway {

namespace pb = mer::internal::v1;

namespace {

// How far before the server's deadline a client's deadline can arrive as a cancellation (the
// network, and the cancel watcher's poll on a busy host).
constexpr absl::Duration kDeadlineSlack = absl::Milliseconds(250);

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// gRPC's Generate stream as a GenerateSink.
class GrpcSink final : public GenerateSink {
 public:
  GrpcSink(grpc::ServerContext* context, grpc::ServerWriter<mer::v1::GenerateResponse>* writer)
      : context_(context), writer_(writer) {}
  bool Write(const mer::v1::GenerateResponse& response) override { return writer_->Write(response); }
  bool ClientGone() override { return context_->IsCancelled(); }

 private:
  grpc::ServerContext* const context_;
  grpc::ServerWriter<mer::v1::GenerateResponse>* const writer_;
};

}  // namespace

GatewayService::GatewayService(ComputeClient& compute, Scheduler& scheduler, GatewayMetrics* metrics,
                               const GatewayOptions& options)
    : compute_(compute), scheduler_(scheduler), metrics_(metrics), options_(options) {
  watcher_ = std::thread([this] { WatchLoop(); });
}

GatewayService::~GatewayService() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  watcher_.join();
}

void GatewayService::BeginShutdown() {
  shutting_down_.store(true);
  absl::MutexLock lock(&mu_);
  for (auto& [id, w] : watched_)
    if (w.client != nullptr) w.client->TryCancel();
}

GatewayService::Watched* GatewayService::Watch(GenerateSink* sink, uint64_t* id) {
  absl::MutexLock lock(&mu_);
  *id = next_watch_++;
  Watched& w = watched_[*id];
  w.sink = sink;
  return &w;
}

void GatewayService::SetComputeCall(Watched* w, grpc::ClientContext* client) {
  absl::MutexLock lock(&mu_);
  w->client = client;
  if (client != nullptr && (shutting_down_.load() || w->cancelled.load())) client->TryCancel();
}

void GatewayService::Unwatch(uint64_t id) {
  absl::MutexLock lock(&mu_);
  watched_.erase(id);
}

void GatewayService::WatchLoop() {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopped), options_.cancel_poll)) {
    // A call blocked in the queue or reading its compute stream cannot see its own client
    // leave; this does.
    bool poke = false;
    for (auto& [id, w] : watched_) {
      if (!w.cancelled.load() && w.sink->ClientGone()) {
        w.cancelled.store(true);
        if (w.client != nullptr) w.client->TryCancel();
        poke = true;
      }
    }
    if (poke) scheduler_.Poke();
  }
}

grpc::Status GatewayService::Generate(grpc::ServerContext* context, const mer::v1::GenerateRequest* request,
                                      grpc::ServerWriter<mer::v1::GenerateResponse>* writer) {
  GrpcSink sink(context, writer);
  return ToGrpcStatus(Run(*request, sink, absl::FromChrono(context->deadline())));
}

absl::Status GatewayService::Run(const mer::v1::GenerateRequest& request, GenerateSink& sink,
                                 absl::Time deadline) {
  const absl::Time start = absl::Now();
  absl::Status result = GenerateImpl(request, sink, deadline, start);
  // A client's deadline reaches the server as a cancellation, a little before the server's own
  // copy of the deadline (taken on arrival) runs out; the client reports DEADLINE_EXCEEDED, and
  // so must the metrics. A cancel that close to the deadline is counted as the deadline.
  if (absl::IsCancelled(result) && deadline - absl::Now() < kDeadlineSlack)
    result = absl::DeadlineExceededError("deadline exceeded");
  if (metrics_ != nullptr) {
    metrics_->OnRequestEnd(static_cast<grpc::StatusCode>(result.code()));
    metrics_->ObserveDuration(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return result;
}

absl::Status GatewayService::GenerateImpl(const mer::v1::GenerateRequest& request, GenerateSink& sink,
                                          absl::Time deadline, absl::Time start) {
  const auto t0 = std::chrono::steady_clock::now();
  if (shutting_down_.load()) return absl::UnavailableError("mer-gateway is shutting down");
  const std::shared_ptr<const ServedModel> model = compute_.model();
  if (model == nullptr) return absl::UnavailableError("mer-compute is not available");
  const pb::Info& info = model->info;
  const ModelLimits limits{info.vocab_size(), info.max_context_tokens(), info.kv_budget_tokens()};
  ASSIGN_OR_RETURN(ValidatedRequest v,
                   ValidateGenerateRequest(request, model->tokenizer, limits, options_.limits));

  uint64_t watch;
  Watched* watched = Watch(&sink, &watch);
  absl::Cleanup unwatch = [this, watch] { Unwatch(watch); };
  RETURN_IF_ERROR(scheduler_.Admit(v.priority, v.kv_tokens, deadline, &watched->cancelled));
  absl::Cleanup release = [this, &v] { scheduler_.Release(v.kv_tokens); };
  const double queue_seconds = Since(t0);
  const int prompt_tokens = v.compute.prompt_size();
  if (metrics_ != nullptr) {
    metrics_->ObserveQueue(queue_seconds);
    metrics_->AddPromptTokens(prompt_tokens);
  }

  grpc::ClientContext call;
  if (deadline != absl::InfiniteFuture()) call.set_deadline(absl::ToChronoTime(deadline));
  SetComputeCall(watched, &call);
  absl::Cleanup detach = [this, watched] { SetComputeCall(watched, nullptr); };  // before `call` goes
  std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader = compute_.stub().Generate(&call, v.compute);

  TextStream text(v.stops);
  const Tokenizer& tokenizer = model->tokenizer;
  mer::v1::GenerateResponse out;
  pb::GenerateResponse in;
  int completion = 0;
  double ttft = 0;
  auto last_token = t0;
  bool stopped = false, client_gone = false;
  int32_t last_id = -1;
  mer::v1::FinishReason finish = mer::v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&in)) {
    mer::v1::Chunk* chunk = out.mutable_chunk();
    chunk->Clear();
    const auto now = std::chrono::steady_clock::now();
    for (int i = 0; i < in.token_ids_size(); ++i) {
      const int32_t id = in.token_ids(i);
      last_id = id;
      chunk->add_token_ids(id);
      if (i < in.logprobs_size()) {
        const pb::TokenLogprob& lp = in.logprobs(i);
        mer::v1::TokenLogprob* o = chunk->add_logprobs();
        o->set_logprob(lp.logprob());
        *o->mutable_top_ids() = lp.top_ids();
        *o->mutable_top_logprobs() = lp.top_logprobs();
      }
      if (completion++ == 0) {
        ttft = Since(t0);
        if (metrics_ != nullptr) metrics_->ObserveTtft(ttft);
      } else if (metrics_ != nullptr) {
        metrics_->ObserveInterToken(std::chrono::duration<double>(now - last_token).count());
      }
      last_token = now;
      const std::string_view bytes = tokenizer.TokenPiece(id);
      const std::string piece = text.Append(absl::string_view(bytes.data(), bytes.size()));
      chunk->mutable_text()->append(piece);
      if (text.stopped()) {
        stopped = true;
        break;
      }
    }
    if (chunk->token_ids_size() > 0 && !sink.Write(out)) {
      client_gone = true;
      call.TryCancel();
      break;
    }
    if (stopped) {
      call.TryCancel();  // compute drops the sequence before its next step
      break;
    }
    if (in.done()) {
      finish = in.finish_reason() == pb::FINISH_REASON_STOP_TOKEN ? mer::v1::FINISH_REASON_EOS
                                                                   : mer::v1::FINISH_REASON_LENGTH;
    }
  }
  const grpc::Status compute_status = reader->Finish();
  if (metrics_ != nullptr) metrics_->AddGeneratedTokens(completion);
  if (stopped) finish = mer::v1::FINISH_REASON_STOP;
  if (finish == mer::v1::FINISH_REASON_UNSPECIFIED) {
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("deadline exceeded while generating");
    if (client_gone || watched->cancelled.load() || sink.ClientGone())
      return absl::CancelledError("cancelled by the client");
    if (shutting_down_.load()) {
      finish = mer::v1::FINISH_REASON_CANCELLED;
    } else {
      absl::Status s = FromGrpcStatus(compute_status);
      if (s.ok()) return absl::InternalError("mer-compute ended the stream without a final message");
      if (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled) {
        compute_.PollNow();
        return absl::UnavailableError(absl::StrCat("mer-compute failed during generation: ", s.message()));
      }
      return absl::Status(s.code(), absl::StrCat("mer-compute: ", s.message()));
    }
  }
  if (const std::string tail = text.Finish(); !tail.empty()) {
    out.mutable_chunk()->Clear();
    out.mutable_chunk()->set_text(tail);
    if (!sink.Write(out)) return absl::CancelledError("cancelled by the client");
  }
  mer::v1::Final* f = out.mutable_final();
  f->set_finish_reason(finish);
  f->set_stop_token_id(finish == mer::v1::FINISH_REASON_EOS ? last_id : -1);
  if (stopped) f->set_stop_sequence(text.stop_sequence());
  mer::v1::Usage* u = f->mutable_usage();
  u->set_prompt_tokens(prompt_tokens);
  u->set_completion_tokens(completion);
  u->set_queue_seconds(queue_seconds);
  u->set_ttft_seconds(ttft);
  u->set_total_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  if (!sink.Write(out)) return absl::CancelledError("cancelled by the client");
  if (metrics_ != nullptr) {
    metrics_->OnFinish(finish == mer::v1::FINISH_REASON_LENGTH      ? "length"
                       : finish == mer::v1::FINISH_REASON_CANCELLED ? "abort"
                                                                    : "stop");
  }
  return absl::OkStatus();
}

grpc::Status GatewayService::Tokenize(grpc::ServerContext*, const mer::v1::TokenizeRequest* request,
                                      mer::v1::TokenizeResponse* response) {
  return ToGrpcStatus(TokenizeImpl(*request, response));
}

absl::Status GatewayService::TokenizeImpl(const mer::v1::TokenizeRequest& request,
                                          mer::v1::TokenizeResponse* response) {
  const std::shared_ptr<const ServedModel> model = compute_.model();
  if (model == nullptr) return absl::UnavailableError("mer-compute is not available");
  const std::vector<int32_t> ids = model->tokenizer.Encode(request.text(), true, request.add_special());
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  return absl::OkStatus();
}

grpc::Status GatewayService::Detokenize(grpc::ServerContext*, const mer::v1::DetokenizeRequest* request,
                                        mer::v1::DetokenizeResponse* response) {
  return ToGrpcStatus(DetokenizeImpl(*request, response));
}

absl::Status GatewayService::DetokenizeImpl(const mer::v1::DetokenizeRequest& request,
                                            mer::v1::DetokenizeResponse* response) {
  const std::shared_ptr<const ServedModel> model = compute_.model();
  if (model == nullptr) return absl::UnavailableError("mer-compute is not available");
  const int32_t vocab = model->tokenizer.vocab_size();
  for (int i = 0; i < request.token_ids_size(); ++i) {
    const int32_t id = request.token_ids(i);
    if (id < 0 || id >= vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("token_ids[", i, "]: token ", id, " is not in the vocabulary [0, ", vocab, ")"));
  }
  TextStream text;  // whole characters; bytes that cannot form one become U+FFFD
  std::string out = text.Append(model->tokenizer.Decode(request.token_ids(), request.render_special()));
  out += text.Finish();
  response->set_text(std::move(out));
  return absl::OkStatus();
}

grpc::Status GatewayService::GetModelInfo(grpc::ServerContext*, const mer::v1::GetModelInfoRequest*,
                                          mer::v1::ModelInfo* response) {
  return ToGrpcStatus(GetModelInfoImpl(response));
}

absl::Status GatewayService::GetModelInfoImpl(mer::v1::ModelInfo* r) {
  const std::shared_ptr<const ServedModel> model = compute_.model();
  if (model == nullptr) return absl::UnavailableError("mer-compute is not available");
  const pb::Info& i = model->info;
  r->set_architecture(i.architecture());
  r->set_name(i.name());
  r->set_vocab_size(i.vocab_size());
  r->set_n_embd(i.n_embd());
  r->set_n_layer(i.n_layer());
  r->set_n_head(i.n_head());
  r->set_n_head_kv(i.n_head_kv());
  r->set_head_dim(i.head_dim());
  r->set_n_expert(i.n_expert());
  r->set_n_expert_used(i.n_expert_used());
  r->set_expert_ffn(i.expert_ffn());
  r->set_quantization(i.quantization());
  r->set_context_length(i.context_length());
  r->set_max_context_tokens(i.max_context_tokens());
  r->set_max_sequences(i.max_sequences());
  r->set_backend(i.backend());
  r->set_bos_id(model->tokenizer.bos_id());
  r->set_eos_id(model->tokenizer.eos_id());
  r->mutable_end_of_generation_ids()->Add(model->end_of_generation.begin(), model->end_of_generation.end());
  r->set_chat_template(model->chat_template);
  auto tier = [r](const char* name, uint64_t bytes) {
    if (bytes == 0) return;
    mer::v1::TierBudget* t = r->add_tiers();
    t->set_tier(name);
    t->set_bytes(bytes);
  };
  tier("vram", i.vram_expert_bytes());
  tier("ram", i.ram_expert_bytes());
  tier("store", i.store_expert_bytes());
  return absl::OkStatus();
}

}  // namespace mer::gateway
