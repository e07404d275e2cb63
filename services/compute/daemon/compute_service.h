// mer-compute's internal gRPC service (proto/mer/internal/v1/compute.proto) over a Batcher:
// Generate submits a sequence and streams its tokens; GetInfo reports the model and the free
// capacity; GetTokenizer the vocabulary. Requests are checked by the Batcher (INVALID_ARGUMENT
// naming the field), so a bad call never reaches the backend.
//
// Cancellation: the sync API tells a handler nothing when its call is cancelled, so one watcher
// thread checks every running call (ServerContext::IsCancelled) each cancel_poll and cancels
// the sequence of a cancelled one, which wakes its handler and makes the step thread drop it
// before the next step. (Polling in each handler instead costs a wake-up per call per poll: at
// 64 streams on 2 cores that halved throughput.) A handler also ends its call at the deadline or
// when its peer is gone (a failed Write).
//
// Thread-safety: gRPC calls the handlers on its threads, concurrently; info_ and vocab_ are
// constant after construction; the watch list is guarded by mu_; the Batcher is thread-safe.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "mer/internal/v1/compute.grpc.pb.h"
#include "services/compute/daemon/batcher.h"

namespace mer::compute {

struct ComputeServiceOptions {
  // How often the watcher checks the running calls for cancellation.
  absl::Duration cancel_poll = absl::Milliseconds(2);
  // Longest wait of a handler between looks at its deadline.
  absl::Duration deadline_poll = absl::Milliseconds(100);
  // Whether generation can work now (OK), or why not (Unavailable: e.g. mer-residency is
  // unreachable). GetInfo reports it; Generate fails at once with it. Empty: always OK.
  std::function<absl::Status()> serving;
};

class ComputeService final : public mer::internal::v1::Compute::Service {
 public:
  // `info` holds the static fields (the capacity fields are filled per call); `vocab` is what
  // GetTokenizer returns. `batcher` outlives the service.
  ComputeService(Batcher& batcher, mer::internal::v1::Info info, mer::internal::v1::TokenizerVocab vocab,
                 const ComputeServiceOptions& options = {});
  ~ComputeService() override;  // stops the watcher

  grpc::Status Generate(grpc::ServerContext* context, const mer::internal::v1::GenerateRequest* request,
                        grpc::ServerWriter<mer::internal::v1::GenerateResponse>* writer) override;
  grpc::Status GetInfo(grpc::ServerContext* context, const mer::internal::v1::GetInfoRequest* request,
                       mer::internal::v1::Info* response) override;
  grpc::Status GetTokenizer(grpc::ServerContext* context, const mer::internal::v1::GetTokenizerRequest* request,
                            mer::internal::v1::TokenizerVocab* response) override;

 private:
  void WatchLoop();

  Batcher& batcher_;
  const mer::internal::v1::Info info_;
  const mer::internal::v1::TokenizerVocab vocab_;
  const ComputeServiceOptions options_;

  absl::Mutex mu_;
  std::map<uint64_t, std::pair<grpc::ServerContext*, std::shared_ptr<SequenceStream>>> watched_ ABSL_GUARDED_BY(mu_);
  uint64_t next_watch_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace mer::compute
