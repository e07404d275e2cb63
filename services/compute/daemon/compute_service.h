// mer-compute's internal gRPC service (proto/mer/internal/v1/compute.proto) over a Batcher:
// Generate submits a sequence and streams its tokens; GetInfo reports the model and the free
// capacity; GetTokenizer the vocabulary. Requests are checked by the Batcher (INVALID_ARGUMENT
// naming the field), so a bad call never reaches the backend.
//
// Cancellation: a handler waits for its sequence's tokens in slices of cancel_poll and checks
// its call between them; a cancelled call (or one past its deadline, or whose peer is gone)
// cancels the sequence, which the step thread drops before its next step.
//
// Thread-safety: gRPC calls the handlers on its threads, concurrently; the members are constant
// after construction apart from the Batcher, which is thread-safe.
#pragma once

#include "absl/time/time.h"
#include "mer/internal/v1/compute.grpc.pb.h"
#include "services/compute/daemon/batcher.h"

namespace mer::compute {

struct ComputeServiceOptions {
  // How often a waiting handler checks its call for cancellation.
  absl::Duration cancel_poll = absl::Milliseconds(2);
};

class ComputeService final : public mer::internal::v1::Compute::Service {
 public:
  // `info` holds the static fields (the capacity fields are filled per call); `vocab` is what
  // GetTokenizer returns. `batcher` outlives the service.
  ComputeService(Batcher& batcher, mer::internal::v1::Info info,
                 mer::internal::v1::TokenizerVocab vocab, const ComputeServiceOptions& options = {});

  grpc::Status Generate(grpc::ServerContext* context,
                        const mer::internal::v1::GenerateRequest* request,
                        grpc::ServerWriter<mer::internal::v1::GenerateResponse>* writer) override;
  grpc::Status GetInfo(grpc::ServerContext* context, const mer::internal::v1::GetInfoRequest* request,
                       mer::internal::v1::Info* response) override;
  grpc::Status GetTokenizer(grpc::ServerContext* context,
                            const mer::internal::v1::GetTokenizerRequest* request,
                            mer::internal::v1::TokenizerVocab* response) override;

 private:
  Batcher& batcher_;
  const mer::internal::v1::Info info_;
  const mer::internal::v1::TokenizerVocab vocab_;
  const ComputeServiceOptions options_;
};

}  // namespace mer::compute
