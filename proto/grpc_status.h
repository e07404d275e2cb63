// The one conversion between absl::Status (what every mer module returns) and grpc::Status (what
// crosses a gRPC call): the canonical codes are the same numbers in both, the message is kept.
// Used by mer-gateway at its public edge, by mer-compute at its internal one, and by the
// clients, so a code chosen deep inside (say, kResourceExhausted in the batcher) reaches the user
// unchanged.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace mer {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);
// "RESOURCE_EXHAUSTED" and so on (the names of grpc.StatusCode).
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace mer
