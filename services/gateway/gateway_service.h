// mer-gateway's public service (proto/mer/v1/mer.proto). Generate: validate (InvalidArgument
// naming the field), queue for admission (Scheduler), stream the compute call's tokens as text
// (TextStream: whole UTF-8 characters, stop sequences), then the final message with usage.
// Run is that path for every front: gRPC's Generate and the HTTP API (http_api.h) both call it,
// each with its own GenerateSink.
//
// Memory: Generate and Tokenize read their request themselves, as bytes (split streaming), so
// that the read, the checks and the tokenization of a call happen in its intake, of which at
// most intake_max run at once; a call waits for its turn before its message is read. Each intake
// holds at most a request of the server's maximum receive size a few times over (the bytes, the
// parsed message, the tokenizer's working set); afterwards a call holds only its token ids (at
// most the context). The HTTP API reads, parses and tokenizes each request body in an intake
// turn as well (BeginIntake). So the gateway's memory is bounded whatever the clients send.
//
// Errors: every failure is an absl::Status inside; Generate turns it into the call's gRPC status
// with proto/grpc_status.h's ToGrpcStatus (the one conversion). Compute failures come back as
// compute reported them (UNAVAILABLE when it died, DEADLINE_EXCEEDED, ...); a client that
// cancels gets CANCELLED and its compute call is cancelled too, within cancel_poll.
//
// Thread-safety: gRPC calls the handlers concurrently; the members are thread-safe (the
// scheduler, the compute client, the metrics, the cancel watcher under its mutex).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mer/v1/mer.grpc.pb.h"
#include "services/gateway/compute_client.h"
#include "services/gateway/gateway_metrics.h"
#include "services/gateway/request_validation.h"
#include "services/gateway/scheduler.h"

namespace mer::gateway {

// Where one generation's messages go: a gRPC stream or an HTTP response.
class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  // Sends one message (chunks, then the final one); false when the client is gone.
  virtual bool Write(const mer::v1::GenerateResponse& response) = 0;
  // Whether the client went away. Polled by the cancel watcher, on its own thread, while the
  // call is queued or generating.
  virtual bool ClientGone() = 0;
};

struct GatewayOptions {
  RequestLimits limits;
  // How often the cancel watcher looks for cancelled client calls (to take them out of the
  // queue, or to cancel their compute calls).
  absl::Duration cancel_poll = absl::Milliseconds(5);
  // Calls in their intake (request read, checked, tokenized) at once; more wait for a turn.
  int intake_max = 4;
  // Longest a Generate call may take, queue included, whatever deadline the client set (or none):
  // then it ends with DEADLINE_EXCEEDED, so a wedged mer-compute cannot hold calls forever.
  absl::Duration max_call_duration = absl::Minutes(10);
};

class GatewayService final : public mer::v1::Mer::Service {
 public:
  // `metrics` may be null. All outlive the service.
  GatewayService(ComputeClient& compute, Scheduler& scheduler, GatewayMetrics* metrics,
                 const GatewayOptions& options = {});
  ~GatewayService() override;

  using GenerateStream = grpc::ServerSplitStreamer<grpc::ByteBuffer, mer::v1::GenerateResponse>;
  using TokenizeStream = grpc::ServerUnaryStreamer<grpc::ByteBuffer, mer::v1::TokenizeResponse>;
  // Registered in place of the generated Generate and Tokenize handlers (see Memory above).
  grpc::Status GenerateStreamed(grpc::ServerContext* context, GenerateStream* stream);
  grpc::Status TokenizeStreamed(grpc::ServerContext* context, TokenizeStream* stream);
  grpc::Status Detokenize(grpc::ServerContext* context, const mer::v1::DetokenizeRequest* request,
                          mer::v1::DetokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context, const mer::v1::GetModelInfoRequest* request,
                            mer::v1::ModelInfo* response) override;

  // One generation, whichever front it came from: validates (in an intake turn), waits for
  // admission until `deadline` (or the maximum call duration, whichever comes first), streams
  // chunks and then the final message to `sink`, and counts the call in the metrics. The status
  // is the call's (OK once the final message was written).
  absl::Status Run(const mer::v1::GenerateRequest& request, GenerateSink& sink, absl::Time deadline);
  // Tokenizes request.text (at most limits.max_prompt_bytes). The caller holds an intake turn.
  absl::Status TokenizeImpl(const mer::v1::TokenizeRequest& request, mer::v1::TokenizeResponse* response);
  absl::Status DetokenizeImpl(const mer::v1::DetokenizeRequest& request, mer::v1::DetokenizeResponse* response);
  absl::Status GetModelInfoImpl(mer::v1::ModelInfo* response);

  // An intake turn (see Memory above), for a front that reads and tokenizes requests itself (the
  // HTTP API): waits for one until `deadline`, or until *cancelled (may be null) or the service
  // shuts down; EndIntake gives it back. Not to be held across Run, which takes its own.
  absl::Status BeginIntake(const std::atomic<bool>* cancelled, absl::Time deadline);
  void EndIntake();

  const GatewayOptions& options() const { return options_; }

  // Shutdown begins: running Generate calls end with FINISH_REASON_CANCELLED, new ones get
  // UNAVAILABLE.
  void BeginShutdown();

 private:
  // Reads the call's request, in its intake turn: a message the reader owns, or one it parsed
  // into `storage`.
  using RequestReader =
      absl::FunctionRef<absl::StatusOr<const mer::v1::GenerateRequest*>(mer::v1::GenerateRequest* storage)>;
  // Run's path, for any reader: gRPC's reads the call's bytes, the HTTP API's hands its message.
  absl::Status RunWith(RequestReader read, GenerateSink& sink, absl::Time client_deadline);
  absl::Status GenerateImpl(RequestReader read, GenerateSink& sink, absl::Time client_deadline, absl::Time start);
  absl::Status TokenizeStreamedImpl(grpc::ServerContext* context, TokenizeStream* stream);

  void WatchLoop();
  // A call from its start: the client may cancel while it is queued (the scheduler sees
  // `cancelled`) or while it generates (its compute call `client` is cancelled).
  struct Watched {
    std::function<bool()> client_gone;      // polled by the cancel watcher
    grpc::ClientContext* client = nullptr;  // set once the compute call starts
    std::atomic<bool> cancelled{false};
  };
  Watched* Watch(std::function<bool()> client_gone, uint64_t* id);
  // `client` may be null: the compute call is over (before its context is destroyed).
  void SetComputeCall(Watched* w, grpc::ClientContext* client);
  void Unwatch(uint64_t id);

  ComputeClient& compute_;
  Scheduler& scheduler_;
  GatewayMetrics* const metrics_;
  const GatewayOptions options_;
  std::atomic<bool> shutting_down_{false};

  absl::Mutex mu_;
  std::map<uint64_t, Watched> watched_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(mu_) = 0;
  int intake_ ABSL_GUARDED_BY(mu_) = 0;  // calls in their intake
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace mer::gateway
