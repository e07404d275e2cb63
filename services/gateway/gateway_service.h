// mer-gateway's public service (proto/mer/v1/mer.proto). Generate: validate (InvalidArgument
// naming the field), queue for admission (Scheduler), stream the compute call's tokens as text
// (TextStream: whole UTF-8 characters, stop sequences), then the final message with usage.
// Run is that path for every front: gRPC's Generate and the HTTP API (http_api.h) both call it,
// each with its own GenerateSink.
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
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
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
};

class GatewayService final : public mer::v1::Mer::Service {
 public:
  // `metrics` may be null. All outlive the service.
  GatewayService(ComputeClient& compute, Scheduler& scheduler, GatewayMetrics* metrics,
                 const GatewayOptions& options = {});
  ~GatewayService() override;

  grpc::Status Generate(grpc::ServerContext* context, const mer::v1::GenerateRequest* request,
                        grpc::ServerWriter<mer::v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const mer::v1::TokenizeRequest* request,
                        mer::v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const mer::v1::DetokenizeRequest* request,
                          mer::v1::DetokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context, const mer::v1::GetModelInfoRequest* request,
                            mer::v1::ModelInfo* response) override;

  // One generation, whichever front it came from: validates, waits for admission until
  // `deadline`, streams chunks and then the final message to `sink`, and counts the call in the
  // metrics. The status is the call's (OK once the final message was written).
  absl::Status Run(const mer::v1::GenerateRequest& request, GenerateSink& sink, absl::Time deadline);
  absl::Status TokenizeImpl(const mer::v1::TokenizeRequest& request, mer::v1::TokenizeResponse* response);
  absl::Status DetokenizeImpl(const mer::v1::DetokenizeRequest& request, mer::v1::DetokenizeResponse* response);
  absl::Status GetModelInfoImpl(mer::v1::ModelInfo* response);

  // Shutdown begins: running Generate calls end with FINISH_REASON_CANCELLED, new ones get
  // UNAVAILABLE.
  void BeginShutdown();

 private:
  absl::Status GenerateImpl(const mer::v1::GenerateRequest& request, GenerateSink& sink, absl::Time deadline,
                            absl::Time start);

  void WatchLoop();
  // A call from its start: the client may cancel while it is queued (the scheduler sees
  // `cancelled`) or while it generates (its compute call `client` is cancelled).
  struct Watched {
    GenerateSink* sink = nullptr;
    grpc::ClientContext* client = nullptr;  // set once the compute call starts
    std::atomic<bool> cancelled{false};
  };
  Watched* Watch(GenerateSink* sink, uint64_t* id);
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
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace mer::gateway
