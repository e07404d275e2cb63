// mer-gateway's public service (proto/mer/v1/mer.proto). Generate: validate (InvalidArgument
// naming the field), queue for admission (Scheduler), stream the compute call's tokens as text
// (TextStream: whole UTF-8 characters, stop sequences), then the final message with usage.
//
// Memory: Generate and Tokenize read their request themselves, as bytes (split streaming), so
// that the read, the checks and the tokenization of a call happen in its intake, of which at
// most intake_max run at once; a call waits for its turn before its message is read. Each intake
// holds at most a request of the server's maximum receive size a few times over (the bytes, the
// parsed message, the tokenizer's working set); afterwards a call holds only its token ids (at
// most the context). So the gateway's memory is bounded whatever the clients send.
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
  grpc::Status GetModelInfo(grpc::ServerContext* context, const mer::v1::GetModelInfoRequest* request,
                            mer::v1::ModelInfo* response) override;

  // Shutdown begins: running Generate calls end with FINISH_REASON_CANCELLED, new ones get
  // UNAVAILABLE.
  void BeginShutdown();

 private:
  absl::Status GenerateImpl(grpc::ServerContext* context, GenerateStream* stream, absl::Time start);
  absl::Status TokenizeImpl(grpc::ServerContext* context, TokenizeStream* stream);
  absl::Status GetModelInfoImpl(mer::v1::ModelInfo* response);

  void WatchLoop();
  // A call from its start: the client may cancel while it is queued (the scheduler sees
  // `cancelled`) or while it generates (its compute call `client` is cancelled).
  struct Watched {
    grpc::ServerContext* server = nullptr;
    grpc::ClientContext* client = nullptr;  // set once the compute call starts
    std::atomic<bool> cancelled{false};
  };
  Watched* Watch(grpc::ServerContext* server, uint64_t* id);
  // Waits for an intake turn until `deadline`, or until the call is cancelled or the service
  // shuts down; EndIntake gives it back.
  absl::Status BeginIntake(const Watched* w, absl::Time deadline);
  void EndIntake();
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
