// The gateway's connection to mer-compute: one gRPC channel to its unix socket, and a thread that
// polls GetInfo. When an instance answers whose instance_id is new (a first start or a restart),
// it fetches the tokenizer and publishes a ServedModel; when GetInfo fails, it publishes none
// (compute is down). Each answer also says whether compute can generate now (serving()).
// `on_change` sees each transition, so the gateway can set the scheduler's
// capacity and the health status. The channel reconnects by itself; nothing needs a restart.
//
// Why the tokenizer comes from compute: the gateway then needs no model file and cannot disagree
// with compute about the vocabulary, even when compute is restarted on another model.
//
// Thread-safety: all methods may be called from any thread; `on_change` runs on the poll thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tokenizer/tokenizer.h"
#include "mer/internal/v1/compute.grpc.pb.h"

namespace mer::gateway {

struct ComputeClientOptions {
  std::string target;                                      // "unix:/run/mer/compute.sock"
  absl::Duration poll_interval = absl::Milliseconds(250);  // GetInfo while up, and retries while down
  absl::Duration info_timeout = absl::Seconds(2);          // deadline of GetInfo
  absl::Duration tokenizer_timeout = absl::Seconds(30);    // deadline of GetTokenizer
};

// One compute instance as the gateway sees it.
struct ServedModel {
  mer::internal::v1::Info info;  // as of the instance's first answer (capacity fields too)
  Tokenizer tokenizer;
  std::vector<int32_t> end_of_generation;  // tokenizer.EndOfGenerationIds(), once
  std::string chat_template;               // the model file's; empty: none
  int32_t max_token_bytes = 1;             // MaxTokenBytes(tokenizer), for request validation
};

class ComputeClient {
 public:
  using OnChange = std::function<void(std::shared_ptr<const ServedModel>)>;
  ComputeClient(const ComputeClientOptions& options, OnChange on_change);
  ~ComputeClient();  // stops the poll thread

  // The instance up now, or null while compute is down.
  std::shared_ptr<const ServedModel> model() const;
  // OK while the instance up now can generate; Unavailable naming why not, as it last reported
  // (GetInfo's `unavailable`: e.g. mer-residency unreachable) or because it is down.
  absl::Status serving() const;
  mer::internal::v1::Compute::Stub& stub() { return *stub_; }
  // A call saw compute fail (UNAVAILABLE): poll now instead of at the next interval.
  void PollNow();

 private:
  void PollLoop();
  absl::Status PollOnce();
  void Publish(std::shared_ptr<const ServedModel> model);

  const ComputeClientOptions options_;
  const OnChange on_change_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<mer::internal::v1::Compute::Stub> stub_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const ServedModel> model_ ABSL_GUARDED_BY(mu_);
  std::string unavailable_ ABSL_GUARDED_BY(mu_);  // the last GetInfo's `unavailable`
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool poll_now_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mer::gateway
