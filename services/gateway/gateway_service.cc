#include "services/gateway/gateway_service.h"

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/method_handler.h"
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

int MethodIndex(absl::string_view name) {
  const auto* service = mer::v1::GenerateRequest::descriptor()->file()->FindServiceByName("Mer");
  return service->FindMethodByName(std::string(name))->index();
}

// The request message of a split-streamed call, as the bytes the client sent. `slices` keeps
// them; one slice (the common case) is used in place, more are joined into `joined`.
template <typename Stream>
absl::StatusOr<absl::string_view> ReadRequest(grpc::ServerContext* context, Stream* stream,
                                              std::vector<grpc::Slice>* slices, std::string* joined) {
  grpc::ByteBuffer bytes;
  if (!stream->Read(&bytes)) {
    if (context->IsCancelled()) return absl::CancelledError("cancelled by the client");
    return absl::InvalidArgumentError("request: no request message");
  }
  if (!bytes.Dump(slices).ok()) return absl::InternalError("request: cannot read its bytes");
  if (slices->size() == 1)
    return absl::string_view(reinterpret_cast<const char*>((*slices)[0].begin()), (*slices)[0].size());
  joined->reserve(bytes.Length());
  for (const grpc::Slice& s : *slices) joined->append(reinterpret_cast<const char*>(s.begin()), s.size());
  slices->clear();
  return absl::string_view(*joined);
}

// gRPC's Generate stream as a GenerateSink.
class GrpcSink final : public GenerateSink {
 public:
  GrpcSink(grpc::ServerContext* context, GatewayService::GenerateStream* stream) : context_(context), stream_(stream) {}
  bool Write(const mer::v1::GenerateResponse& response) override { return stream_->Write(response); }
  bool ClientGone() override { return context_->IsCancelled(); }

 private:
  grpc::ServerContext* const context_;
  GatewayService::GenerateStream* const stream_;
};

}  // namespace

GatewayService::GatewayService(ComputeClient& compute, Scheduler& scheduler, GatewayMetrics* metrics,
                               const GatewayOptions& options)
    : compute_(compute), scheduler_(scheduler), metrics_(metrics), options_(options) {
  MarkMethodStreamed(
      MethodIndex("Generate"),
      new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, mer::v1::GenerateResponse>(
          [this](grpc::ServerContext* context, GenerateStream* stream) { return GenerateStreamed(context, stream); }));
  MarkMethodStreamed(
      MethodIndex("Tokenize"),
      new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, mer::v1::TokenizeResponse>(
          [this](grpc::ServerContext* context, TokenizeStream* stream) { return TokenizeStreamed(context, stream); }));
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

GatewayService::Watched* GatewayService::Watch(std::function<bool()> client_gone, uint64_t* id) {
  absl::MutexLock lock(&mu_);
  *id = next_watch_++;
  Watched& w = watched_[*id];
  w.client_gone = std::move(client_gone);
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

absl::Status GatewayService::BeginIntake(const std::atomic<bool>* cancelled, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const auto gone = [cancelled] { return cancelled != nullptr && cancelled->load(); };
  auto turn = [this, &gone]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return intake_ < options_.intake_max || gone() || shutting_down_.load();
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&turn), deadline))
    return absl::DeadlineExceededError("deadline exceeded waiting to read the request");
  if (gone()) return absl::CancelledError("cancelled by the client");
  if (shutting_down_.load()) return absl::UnavailableError("mer-gateway is shutting down");
  ++intake_;
  return absl::OkStatus();
}

void GatewayService::EndIntake() {
  absl::MutexLock lock(&mu_);
  --intake_;
}

void GatewayService::WatchLoop() {
  absl::MutexLock lock(&mu_);
  auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopped), options_.cancel_poll)) {
    // A call blocked in the queue or reading its compute stream cannot see its own client
    // leave; this does.
    bool poke = false;
    for (auto& [id, w] : watched_) {
      if (!w.cancelled.load() && w.client_gone()) {
        w.cancelled.store(true);
        if (w.client != nullptr) w.client->TryCancel();
        poke = true;
      }
    }
    if (poke) scheduler_.Poke();
  }
}

grpc::Status GatewayService::GenerateStreamed(grpc::ServerContext* context, GenerateStream* stream) {
  GrpcSink sink(context, stream);
  // The request's bytes, read in the call's intake turn.
  const auto read = [context,
                     stream](mer::v1::GenerateRequest* storage) -> absl::StatusOr<const mer::v1::GenerateRequest*> {
    std::vector<grpc::Slice> slices;
    std::string joined;
    ASSIGN_OR_RETURN(const absl::string_view wire, ReadRequest(context, stream, &slices, &joined));
    ASSIGN_OR_RETURN(*storage, ParseGenerateRequest(wire));
    return storage;
  };
  return ToGrpcStatus(RunWith(read, sink, absl::FromChrono(context->deadline())));
}

absl::Status GatewayService::Run(const mer::v1::GenerateRequest& request, GenerateSink& sink, absl::Time deadline) {
  const auto given = [&request](mer::v1::GenerateRequest*) -> absl::StatusOr<const mer::v1::GenerateRequest*> {
    return &request;
  };
  return RunWith(given, sink, deadline);
}

absl::Status GatewayService::RunWith(RequestReader read, GenerateSink& sink, absl::Time client_deadline) {
  const absl::Time start = absl::Now();
  absl::Status result = GenerateImpl(read, sink, client_deadline, start);
  // A client's deadline reaches the server as a cancellation, a little before the server's own
  // copy of the deadline (taken on arrival) runs out; the client reports DEADLINE_EXCEEDED, and
  // so must the metrics. A cancel that close to the deadline is counted as the deadline.
  if (absl::IsCancelled(result) && client_deadline - absl::Now() < kDeadlineSlack)
    result = absl::DeadlineExceededError("deadline exceeded");
  if (metrics_ != nullptr) {
    metrics_->OnRequestEnd(static_cast<grpc::StatusCode>(result.code()));
    metrics_->ObserveDuration(absl::ToDoubleSeconds(absl::Now() - start));
  }
  return result;
}

absl::Status GatewayService::GenerateImpl(RequestReader read, GenerateSink& sink, absl::Time client_deadline,
                                          absl::Time start) {
  const auto t0 = std::chrono::steady_clock::now();
  if (shutting_down_.load()) return absl::UnavailableError("mer-gateway is shutting down");
  const std::shared_ptr<const ServedModel> model = compute_.model();
  if (model == nullptr) return absl::UnavailableError("mer-compute is not available");
  RETURN_IF_ERROR(compute_.serving());
  const pb::Info& info = model->info;
  const ModelLimits limits{info.vocab_size(), info.max_context_tokens(), info.kv_budget_tokens(),
                           model->max_token_bytes};

  // The client's deadline, or the server's own bound on a call, whichever comes first.
  const absl::Time deadline = std::min(client_deadline, start + options_.max_call_duration);
  const auto past_deadline = [&] {
    if (client_deadline <= deadline) return absl::DeadlineExceededError("deadline exceeded while generating");
    return absl::DeadlineExceededError(absl::StrCat("the call reached the server's maximum call duration (",
                                                    absl::FormatDuration(options_.max_call_duration),
                                                    ", mer-gateway --max-call-seconds)"));
  };
  uint64_t watch;
  Watched* watched = Watch([&sink] { return sink.ClientGone(); }, &watch);
  absl::Cleanup unwatch = [this, watch] { Unwatch(watch); };
  ValidatedRequest v;
  {
    // The intake: the request's bytes, its message and its tokenization live only in here.
    RETURN_IF_ERROR(BeginIntake(&watched->cancelled, deadline));
    absl::Cleanup end_intake = [this] { EndIntake(); };
    mer::v1::GenerateRequest storage;
    ASSIGN_OR_RETURN(const mer::v1::GenerateRequest* request, read(&storage));
    ASSIGN_OR_RETURN(v, ValidateGenerateRequest(*request, model->tokenizer, limits, options_.limits));
  }
  RETURN_IF_ERROR(scheduler_.Admit(v.priority, v.kv_tokens, deadline, &watched->cancelled));
  absl::Cleanup release = [this, &v] { scheduler_.Release(v.kv_tokens); };
  const double queue_seconds = Since(t0);
  const int prompt_tokens = v.compute.prompt_size();
  if (metrics_ != nullptr) {
    metrics_->ObserveQueue(queue_seconds);
    metrics_->AddPromptTokens(prompt_tokens);
  }

  grpc::ClientContext call;
  call.set_deadline(absl::ToChronoTime(deadline));
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
    if (absl::Now() >= deadline) return past_deadline();
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

grpc::Status GatewayService::TokenizeStreamed(grpc::ServerContext* context, TokenizeStream* stream) {
  return ToGrpcStatus(TokenizeStreamedImpl(context, stream));
}

absl::Status GatewayService::TokenizeStreamedImpl(grpc::ServerContext* context, TokenizeStream* stream) {
  if (compute_.model() == nullptr) return absl::UnavailableError("mer-compute is not available");
  uint64_t watch;
  Watched* watched = Watch([context] { return context->IsCancelled(); }, &watch);
  absl::Cleanup unwatch = [this, watch] { Unwatch(watch); };
  mer::v1::TokenizeResponse response;
  {
    RETURN_IF_ERROR(BeginIntake(&watched->cancelled, absl::FromChrono(context->deadline())));
    absl::Cleanup end_intake = [this] { EndIntake(); };
    std::vector<grpc::Slice> slices;
    std::string joined;
    ASSIGN_OR_RETURN(const absl::string_view wire, ReadRequest(context, stream, &slices, &joined));
    ASSIGN_OR_RETURN(const mer::v1::TokenizeRequest request, ParseTokenizeRequest(wire));
    RETURN_IF_ERROR(TokenizeImpl(request, &response));
  }
  if (!stream->Write(response)) return absl::CancelledError("cancelled by the client");
  return absl::OkStatus();
}

absl::Status GatewayService::TokenizeImpl(const mer::v1::TokenizeRequest& request,
                                          mer::v1::TokenizeResponse* response) {
  const std::shared_ptr<const ServedModel> model = compute_.model();
  if (model == nullptr) return absl::UnavailableError("mer-compute is not available");
  if (static_cast<int64_t>(request.text().size()) > options_.limits.max_prompt_bytes)
    return absl::InvalidArgumentError(
        absl::StrCat("text: ", request.text().size(), " bytes; at most ", options_.limits.max_prompt_bytes));
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
