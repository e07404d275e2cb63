#include "services/gateway/compute_client.h"

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"
#include "services/gateway/request_validation.h"

namespace mer::gateway {

namespace pb = mer::internal::v1;

ComputeClient::ComputeClient(const ComputeClientOptions& options, OnChange on_change)
    : options_(options), on_change_(std::move(on_change)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);  // the tokenizer
  // Reconnect quickly after a compute restart: recovery waits for the next attempt.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(options_.target, grpc::InsecureChannelCredentials(), args);
  stub_ = pb::Compute::NewStub(channel_);
  thread_ = std::thread([this] { PollLoop(); });
}

ComputeClient::~ComputeClient() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

std::shared_ptr<const ServedModel> ComputeClient::model() const {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::Status ComputeClient::serving() const {
  absl::MutexLock lock(&mu_);
  if (model_ == nullptr) return absl::UnavailableError("mer-compute is not available");
  if (!unavailable_.empty())
    return absl::UnavailableError(absl::StrCat("mer-compute cannot generate now: ", unavailable_));
  return absl::OkStatus();
}

void ComputeClient::PollNow() {
  absl::MutexLock lock(&mu_);
  poll_now_ = true;
}

void ComputeClient::Publish(std::shared_ptr<const ServedModel> model) {
  {
    absl::MutexLock lock(&mu_);
    if (model_ == model) return;
    model_ = model;
  }
  if (on_change_) on_change_(std::move(model));
}

absl::Status ComputeClient::PollOnce() {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.info_timeout));
  pb::Info info;
  grpc::Status s = stub_->GetInfo(&ctx, pb::GetInfoRequest(), &info);
  if (!s.ok()) return FromGrpcStatus(s);
  {
    absl::MutexLock lock(&mu_);
    if (info.unavailable() != unavailable_) {
      if (info.unavailable().empty()) {
        std::fprintf(stderr, "mer-gateway: mer-compute can generate again\n");
      } else {
        std::fprintf(stderr, "mer-gateway: mer-compute cannot generate: %s\n", info.unavailable().c_str());
      }
      unavailable_ = info.unavailable();
    }
  }
  const std::shared_ptr<const ServedModel> current = model();
  if (current != nullptr && current->info.instance_id() == info.instance_id()) return absl::OkStatus();

  grpc::ClientContext tctx;
  tctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.tokenizer_timeout));
  pb::TokenizerVocab vp;
  s = stub_->GetTokenizer(&tctx, pb::GetTokenizerRequest(), &vp);
  if (!s.ok()) return FromGrpcStatus(s);
  TokenizerVocab vocab;
  vocab.tokens.assign(vp.tokens().begin(), vp.tokens().end());
  vocab.token_types.assign(vp.token_types().begin(), vp.token_types().end());
  vocab.merges.assign(vp.merges().begin(), vp.merges().end());
  vocab.pre = vp.pre();
  vocab.bos_id = vp.bos_id();
  vocab.eos_id = vp.eos_id();
  vocab.add_bos = vp.add_bos();
  vocab.add_eos = vp.add_eos();
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(std::move(vocab));
  if (!tokenizer.ok())
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat("mer-compute's tokenizer: ", tokenizer.status().message()));
  std::vector<int32_t> eog = tokenizer->EndOfGenerationIds();
  const int32_t max_token_bytes = MaxTokenBytes(*tokenizer);
  Publish(std::make_shared<const ServedModel>(
      ServedModel{std::move(info), std::move(*tokenizer), std::move(eog), vp.chat_template(), max_token_bytes}));
  return absl::OkStatus();
}

void ComputeClient::PollLoop() {
  bool reported = false;
  for (;;) {
    const absl::Status s = PollOnce();
    if (!s.ok()) {
      if (!reported) {
        std::fprintf(stderr, "mer-gateway: mer-compute at %s is unavailable: %s\n", options_.target.c_str(),
                     std::string(s.message()).c_str());
        reported = true;
      }
      Publish(nullptr);
    } else if (reported || model() != nullptr) {
      if (reported) std::fprintf(stderr, "mer-gateway: mer-compute at %s is up\n", options_.target.c_str());
      reported = false;
    }
    absl::MutexLock lock(&mu_);
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || poll_now_; };
    mu_.AwaitWithTimeout(absl::Condition(&wake), options_.poll_interval);
    if (stop_) return;
    poll_now_ = false;
  }
}

}  // namespace mer::gateway
