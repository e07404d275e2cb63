// The public API end to end in one process: a real mer-compute service (Batcher over the cpu
// engine on a micro model) on a unix socket, the real gateway service on a TCP port, and real
// gRPC stubs.
#include <gtest/gtest.h>

#include <unistd.h>
#include "tests/unit/process_temp_dir.h"

#include <atomic>
#include <filesystem>
#include <thread>

#include "common/model/expert_source.h"
#include "common/model/model_tokenizer.h"
#include "common/model/synth_model.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "mer/v1/mer.grpc.pb.h"
#include "services/compute/cpu/cpu_engine.h"
#include "services/compute/daemon/batcher.h"
#include "services/compute/daemon/compute_service.h"
#include "services/compute/generation.h"
#include "services/gateway/gateway_service.h"
#include "services/gateway/text_stream.h"

namespace mer::gateway {
namespace {

namespace fs = std::filesystem;

// Mapped experts with an optional per-layer delay, to keep sequences running long enough.
class SlowExpertSource final : public ExpertSource {
 public:
  explicit SlowExpertSource(const ModelWeights& w) : mapped_(w) {}
  absl::Status AcquireLayer(int layer, absl::Span<const int32_t> experts, absl::Span<ExpertWeights> out) override {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    return mapped_.AcquireLayer(layer, experts, out);
  }
  void ReleaseLayer(int layer) override {}
  std::atomic<int> delay_ms{0};

 private:
  MappedExpertSource mapped_;
};

// A compute daemon in process: engine, batcher and the internal service on `socket`.
struct Compute {
  Compute(const ModelWeights& w, SlowExpertSource& src, const internal::v1::TokenizerVocab& vocab,
          const std::string& socket) {
    CpuEngineOptions o;
    o.threads = 1;
    o.max_sequences = 2;
    o.max_batch_tokens = 16;
    o.max_context_tokens = 128;
    engine = std::move(*CpuEngine::Create(w, src, o));
    compute::BatcherOptions bo;
    bo.admission_wait = absl::Seconds(5);
    batcher = std::make_unique<compute::Batcher>(*engine, bo);
    internal::v1::Info info;
    info.set_instance_id(++instances);
    info.set_architecture("qwen3moe");
    info.set_vocab_size(w.config().n_vocab);
    info.set_max_context_tokens(engine->max_context_tokens());
    service = std::make_unique<compute::ComputeService>(*batcher, info, vocab);
    fs::remove(socket);
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    b.RegisterService(service.get());
    server = b.BuildAndStart();
  }
  ~Compute() {
    // Like a crash for the calls in flight: they are cancelled at once.
    server->Shutdown(std::chrono::system_clock::now());
    batcher.reset();
  }
  static inline uint64_t instances = 0;
  std::unique_ptr<CpuEngine> engine;
  std::unique_ptr<compute::Batcher> batcher;
  std::unique_ptr<compute::ComputeService> service;
  std::unique_ptr<grpc::Server> server;
};

// One call of `method` over a generic stub, whatever the bytes: `request` as its only message
// (then half-closed), the first response message's bytes (empty if none) and the status.
struct RawResult {
  grpc::Status status;
  std::string response;
};
RawResult RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                  const std::string& request) {
  grpc::GenericStub generic(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  void* tag;
  bool ok;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = generic.PrepareCall(&ctx, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice slice(request);
  grpc::ByteBuffer out(&slice, 1);
  call->WriteLast(out, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  RawResult r;
  if (cq.Next(&tag, &ok) && ok) {
    std::vector<grpc::Slice> slices;
    if (in.Dump(&slices).ok()) {
      for (const auto& s : slices) r.response.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  call->Finish(&r.status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return r;
}

// Polls `done` every millisecond for up to `limit`; whether it came true. Generous limits: the
// test machine may be loaded, and the conditions are preconditions the tests assert.
template <typename Done>
bool WaitUntil(const Done& done, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

class GatewayApiTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(testing_support::ProcessTempDir("mer_gateway_api_"));
    SynthOptions o;
    o.geometry = *SynthPreset("micro");
    o.seed = 5;
    o.threads = 2;
    const std::string path = (*dir_ / "micro.gguf").string();
    ASSERT_TRUE(WriteSynthModel(o, path).ok());
    file_ = new std::shared_ptr<const GgufFile>(std::move(*GgufFile::Open(path)));
    weights_ = ModelWeights::Load(*file_)->release();
    tokenizer_ = new Tokenizer(*LoadTokenizer(**file_));
    const TokenizerVocab v = *LoadTokenizerVocab(**file_);
    vocab_ = new internal::v1::TokenizerVocab;
    for (const auto& t : v.tokens) vocab_->add_tokens(t);
    for (int32_t t : v.token_types) vocab_->add_token_types(t);
    for (const auto& m : v.merges) vocab_->add_merges(m);
    vocab_->set_pre(v.pre);
    vocab_->set_bos_id(v.bos_id);
    vocab_->set_eos_id(v.eos_id);
  }

  void SetUp() override {
    socket_ = (*dir_ / ("c" + std::to_string(counter_++) + ".sock")).string();
    src_ = std::make_unique<SlowExpertSource>(*weights_);
    compute_ = std::make_unique<Compute>(*weights_, *src_, *vocab_, socket_);
    SchedulerOptions so;
    so.max_queue = 2;
    scheduler_ = std::make_unique<Scheduler>(so);
    ComputeClientOptions co;
    co.target = "unix:" + socket_;
    co.poll_interval = absl::Milliseconds(50);
    client_ = std::make_unique<ComputeClient>(co, [this](std::shared_ptr<const ServedModel> m) {
      if (m)
        scheduler_->SetCapacity(m->info.max_sequences(), m->info.kv_budget_tokens());
      else
        scheduler_->SetUnavailable();
    });
    service_ = std::make_unique<GatewayService>(*client_, *scheduler_, nullptr);
    // As mer-gateway's main does.
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
    stub_ = mer::v1::Mer::NewStub(channel_);
    WaitForCompute(true);
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    service_.reset();
    client_.reset();
    compute_.reset();
  }

  void WaitForCompute(bool up) {
    for (int i = 0; i < 400 && (client_->model() != nullptr) != up; ++i) absl::SleepFor(absl::Milliseconds(10));
    ASSERT_EQ(client_->model() != nullptr, up);
  }

  struct Result {
    grpc::Status status;
    std::vector<int32_t> ids;
    std::string text;
    std::vector<std::string> pieces;
    mer::v1::Final final;
  };
  Result Call(const mer::v1::GenerateRequest& r, int timeout_ms = 20000,
              const std::function<void(grpc::ClientContext&, int)>& on_chunk = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
    auto reader = stub_->Generate(&ctx, r);
    Result out;
    mer::v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.has_chunk()) {
        out.ids.insert(out.ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
        out.text += resp.chunk().text();
        out.pieces.push_back(resp.chunk().text());
        if (on_chunk) on_chunk(ctx, static_cast<int>(out.ids.size()));
      } else {
        out.final = resp.final();
      }
    }
    out.status = reader->Finish();
    return out;
  }

  static mer::v1::GenerateRequest Ids(std::vector<int32_t> ids, int max_new) {
    mer::v1::GenerateRequest r;
    r.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    r.set_max_new_tokens(max_new);
    r.set_ignore_eos(true);
    return r;
  }

  std::vector<int32_t> Solo(const std::vector<int32_t>& prompt, int max_new) {
    MappedExpertSource src(*weights_);
    CpuEngineOptions o;
    o.threads = 1;
    o.max_context_tokens = 128;
    auto e = CpuEngine::Create(*weights_, src, o);
    GenerationRequest g;
    g.prompt = prompt;
    g.max_new_tokens = max_new;
    return *Generate(**e, 0, g, nullptr);
  }

  static inline fs::path* dir_;
  static inline std::shared_ptr<const GgufFile>* file_;
  static inline ModelWeights* weights_;
  static inline Tokenizer* tokenizer_;
  static inline internal::v1::TokenizerVocab* vocab_;
  static inline int counter_ = 0;
  std::string socket_;
  std::unique_ptr<SlowExpertSource> src_;
  std::unique_ptr<Compute> compute_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ComputeClient> client_;
  std::unique_ptr<GatewayService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mer::v1::Mer::Stub> stub_;
};

TEST_F(GatewayApiTest, HealthAndReflection) {
  server_->GetHealthCheckService()->SetServingStatus("mer.v1.Mer", true);
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext hctx;
  grpc::health::v1::HealthCheckRequest hreq;
  hreq.set_service("mer.v1.Mer");
  grpc::health::v1::HealthCheckResponse hresp;
  ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  // grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo with list_services = "*"
  // (field 7), over a generic stub: the answer names the public service.
  const RawResult r =
      RawCall(channel_, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", std::string("\x3a\x01*", 3));
  EXPECT_NE(r.response.find("mer.v1.Mer"), std::string::npos) << r.status.error_message();
}

TEST_F(GatewayApiTest, GreedyStreamsEqualSoloGenerationAndTextIsWholeCharacters) {
  std::vector<std::thread> threads;
  // 2 slots and a queue of 2: four calls at once all get through.
  std::vector<Result> results(4);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back({1 + i, 50 + 3 * i, 7, 200 - i, 33});
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { results[i] = Call(Ids(prompts[i], 20)); });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    const Result& r = results[i];
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, Solo(prompts[i], 20)) << i;
    EXPECT_EQ(r.final.finish_reason(), mer::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(r.final.usage().prompt_tokens(), 5);
    EXPECT_EQ(r.final.usage().completion_tokens(), 20);
    TextStream expect;
    std::string want;
    for (int32_t id : r.ids) {
      const std::string_view p = tokenizer_->TokenPiece(id);
      want += expect.Append(absl::string_view(p.data(), p.size()));
    }
    want += expect.Finish();
    EXPECT_EQ(r.text, want);
    for (const auto& p : r.pieces) EXPECT_TRUE(IsValidUtf8(p));
  }
}

TEST_F(GatewayApiTest, TextPromptsTokenizeAndGetModelInfo) {
  mer::v1::GenerateRequest r;
  r.set_text("hello world");
  r.set_max_new_tokens(4);
  r.set_ignore_eos(true);
  const Result res = Call(r);
  ASSERT_TRUE(res.status.ok()) << res.status.error_message();
  EXPECT_EQ(res.ids, Solo(tokenizer_->Encode("hello world"), 4));
  grpc::ClientContext ctx;
  mer::v1::TokenizeRequest tr;
  tr.set_text("hello world");
  mer::v1::TokenizeResponse tresp;
  ASSERT_TRUE(stub_->Tokenize(&ctx, tr, &tresp).ok());
  EXPECT_EQ(std::vector<int32_t>(tresp.token_ids().begin(), tresp.token_ids().end()),
            tokenizer_->Encode("hello world"));
  grpc::ClientContext ictx;
  mer::v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModelInfo(&ictx, {}, &info).ok());
  EXPECT_EQ(info.vocab_size(), 300);
  EXPECT_EQ(info.max_context_tokens(), 128);
  EXPECT_EQ(info.max_sequences(), 2);
}

TEST_F(GatewayApiTest, InvalidRequestsAreInvalidArgumentNamingTheField) {
  auto expect = [&](mer::v1::GenerateRequest r, const std::string& field) {
    const Result res = Call(r);
    EXPECT_EQ(res.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << field;
    EXPECT_EQ(res.status.error_message().rfind(field + ":", 0), 0u) << res.status.error_message();
    EXPECT_TRUE(res.ids.empty());
  };
  mer::v1::GenerateRequest r = Ids({1, 2}, 0);
  expect(r, "max_new_tokens");
  expect(Ids({1, 2}, 128), "max_new_tokens");
  expect(Ids({1, 300}, 4), "prompt.token_ids[1]");
  r = Ids({1}, 4);
  r.set_temperature(-1);
  expect(r, "temperature");
  r = Ids({1}, 4);
  r.set_top_p(0);
  expect(r, "top_p");
  r.clear_prompt();
  expect(r, "prompt");
  r.set_text("");
  expect(r, "prompt.text");
  expect(Ids(std::vector<int32_t>(129, 3), 1), "prompt");
  // And the service still serves.
  EXPECT_TRUE(Call(Ids({1, 2}, 3)).status.ok());
}

// Requests no protobuf client would send, as bytes on the wire (a generic stub): each is
// INVALID_ARGUMENT naming the field, not an internal error of the parser.
TEST_F(GatewayApiTest, MalformedRequestBytesAreInvalidArgument) {
  const auto raw_generate = [&](const std::string& request) {
    return RawCall(channel_, "/mer.v1.Mer/Generate", request).status;
  };
  mer::v1::GenerateRequest ids = Ids({1, 2}, 3);
  // Text "hi" and token ids: the later would win in a parser.
  grpc::Status s = raw_generate(std::string("\x0a\x02hi", 4) + ids.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "prompt: both text and token_ids are set; set one of them");
  // A text that is not UTF-8.
  mer::v1::GenerateRequest rest;
  rest.set_max_new_tokens(3);
  s = raw_generate(std::string("\x0a\x03\x61\xff\x62", 5) + rest.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(), "prompt.text: not valid UTF-8 at byte 1 of 3");
  // And the service still serves.
  EXPECT_TRUE(Call(Ids({1, 2}, 3)).status.ok());
}

TEST_F(GatewayApiTest, StopSequenceSpanningTokens) {
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23};
  const Result full = Call(Ids(prompt, 40));
  ASSERT_TRUE(full.status.ok());
  // A stop made of the end of one token's text and the start of a later one's.
  std::string pre;
  size_t k = 0;
  std::string stop;
  for (; k + 1 < full.ids.size() && stop.empty(); ++k) {
    const std::string a(tokenizer_->TokenPiece(full.ids[k]));
    const std::string b(tokenizer_->TokenPiece(full.ids[k + 1]));
    const std::string ab = a + b;
    if (a.size() >= 1 && b.size() >= 1 && IsValidUtf8(ab) && full.text.find(ab) != std::string::npos &&
        full.text.find(ab) == full.text.find(pre + ab) + pre.size() && IsValidUtf8(a.substr(a.size() - 1)) &&
        IsValidUtf8(b.substr(0, 1))) {
      stop = a.substr(a.size() - 1) + b.substr(0, 1);
    }
    pre += a;
  }
  if (stop.empty()) GTEST_SKIP() << "no ASCII token boundary in this output";
  mer::v1::GenerateRequest r = Ids(prompt, 40);
  r.add_stop(stop);
  const Result res = Call(r);
  ASSERT_TRUE(res.status.ok()) << res.status.error_message();
  EXPECT_EQ(res.final.finish_reason(), mer::v1::FINISH_REASON_STOP);
  EXPECT_EQ(res.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_LT(res.ids.size(), full.ids.size());
  EXPECT_EQ(res.ids, std::vector<int32_t>(full.ids.begin(), full.ids.begin() + res.ids.size()));
}

TEST_F(GatewayApiTest, CancelDeadlineAndFullQueue) {
  src_->delay_ms = 2;  // ~4 ms a step: 100 tokens take ~0.4 s
  // Cancel after the first tokens: CANCELLED, and compute's slot is free again within a step.
  const Result cancelled = Call(Ids({1, 2, 3}, 100), 20000, [](grpc::ClientContext& ctx, int n) {
    if (n >= 2) ctx.TryCancel();
  });
  EXPECT_EQ(cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
  WaitUntil([&] { return compute_->batcher->free_sequences() == 2; });
  EXPECT_EQ(compute_->batcher->free_sequences(), 2);
  // A deadline while generating; its slot is freed too.
  const Result late = Call(Ids({1, 2, 3}, 100), 100);
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << late.status.error_message();
  WaitUntil([&] { return compute_->batcher->free_sequences() == 2; });
  EXPECT_EQ(compute_->batcher->free_sequences(), 2);
  // 2 slots, a queue of 2: the fifth concurrent call is RESOURCE_EXHAUSTED, the others finish.
  // Very slow steps (~400 ms) while the four are issued, each admitted before the next is sent, so
  // none can finish and none can come after the fifth, however loaded the machine; fast again after.
  src_->delay_ms = 200;
  std::vector<Result> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { results[i] = Call(Ids({1, 2, 3 + i}, 30)); });
    if (!WaitUntil([&] { return scheduler_->running() + scheduler_->waiting() >= i + 1; })) {
      ADD_FAILURE() << "call " << i << " was never admitted";  // go on: the threads must be joined
      break;
    }
  }
  const Result full = Call(Ids({9}, 5));
  EXPECT_EQ(full.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << full.status.error_message();
  src_->delay_ms = 2;
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].ids, Solo({1, 2, 3 + i}, 30));
  }
}

TEST_F(GatewayApiTest, UnavailableWhileComputeIsDownThenServesAgain) {
  src_->delay_ms = 20;  // ~40 ms a step: the call cannot finish before compute goes, however loaded the host
  std::thread running([&] {
    const Result r = Call(Ids({5, 6}, 100));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  });
  EXPECT_TRUE(WaitUntil([&] { return scheduler_->running() >= 1; })) << "the call never started";
  absl::SleepFor(absl::Milliseconds(30));
  compute_.reset();  // compute goes away mid-stream
  running.join();
  WaitForCompute(false);
  EXPECT_EQ(Call(Ids({5, 6}, 4)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
  compute_ = std::make_unique<Compute>(*weights_, *src_, *vocab_, socket_);
  WaitForCompute(true);
  const Result r = Call(Ids({5, 6}, 4));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, Solo({5, 6}, 4));
}

}  // namespace
}  // namespace mer::gateway
