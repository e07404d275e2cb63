// `mer client`: one Generate call (or a health check, or the model info) against mer-gateway.
#include <chrono>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "mer/v1/mer.grpc.pb.h"
#include "proto/grpc_status.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kClientHelp[] =
    R"(usage: mer client --addr HOST:PORT (--prompt TEXT | --prompt-tokens 1,2,3) --max-tokens N
                  [--temperature T --top-k K --top-p P --seed S --repetition-penalty R]
                  [--stop S] [--priority N] [--ignore-eos] [--print-token-ids] [--timeout-ms N]
                  [--stats]
       mer client --addr HOST:PORT --health
       mer client --addr HOST:PORT --info

Calls mer-gateway's Generate and prints the text as it streams (or, with --print-token-ids,
the generated ids on one line at the end). --stop ends generation at a text (it is not printed).
--timeout-ms sets the call's deadline. --stats prints the finish reason and usage to stderr.
--health prints the grpc.health.v1 status of the server; --info prints GetModelInfo.
On an error prints "mer client: CODE: message" and exits 1 (the gRPC status code name).
)";

std::shared_ptr<grpc::Channel> Channel(const std::string& addr) {
  return grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
}

void SetDeadline(grpc::ClientContext* ctx, int64_t timeout_ms) {
  if (timeout_ms > 0) ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

const char* FinishName(mer::v1::FinishReason r) {
  switch (r) {
    case mer::v1::FINISH_REASON_LENGTH:
      return "length";
    case mer::v1::FINISH_REASON_EOS:
      return "eos";
    case mer::v1::FINISH_REASON_STOP:
      return "stop";
    case mer::v1::FINISH_REASON_CANCELLED:
      return "cancelled";
    default:
      return "unspecified";
  }
}

int Report(const grpc::Status& s) {
  std::fprintf(stderr, "mer client: %s: %s\n", GrpcCodeName(s.error_code()).c_str(), s.error_message().c_str());
  return 1;
}

int RunHealth(const std::string& addr, int64_t timeout_ms) {
  auto stub = grpc::health::v1::Health::NewStub(Channel(addr));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_ms > 0 ? timeout_ms : 5000);
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) return Report(s);
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()).c_str());
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

int RunInfo(const std::string& addr, int64_t timeout_ms) {
  auto stub = mer::v1::Mer::NewStub(Channel(addr));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_ms > 0 ? timeout_ms : 5000);
  mer::v1::ModelInfo info;
  const grpc::Status s = stub->GetModelInfo(&ctx, mer::v1::GetModelInfoRequest(), &info);
  if (!s.ok()) return Report(s);
  std::printf("%s", info.DebugString().c_str());
  return 0;
}

}  // namespace

int RunClient(const Args& args) {
  if (MaybeHelp(args, kClientHelp)) return 0;
  auto parsed = Flags::Parse(args,
                             {"addr", "prompt", "prompt-tokens", "max-tokens", "temperature", "top-k", "top-p", "seed",
                              "repetition-penalty", "stop", "priority", "timeout-ms"},
                             {"print-token-ids", "ignore-eos", "health", "info", "stats"});
  if (!parsed.ok()) return Fail("client", parsed.status());
  const Flags& f = *parsed;
  auto body = [&]() -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(const std::string addr, f.Required("addr"));
    ASSIGN_OR_RETURN(const int64_t timeout_ms, f.Int("timeout-ms", 0));
    if (f.Has("health")) return RunHealth(addr, timeout_ms);
    if (f.Has("info")) return RunInfo(addr, timeout_ms);
    mer::v1::GenerateRequest req;
    if (f.Has("prompt") == f.Has("prompt-tokens"))
      return absl::InvalidArgumentError("give exactly one of --prompt and --prompt-tokens");
    if (f.Has("prompt")) {
      req.set_text(f.String("prompt"));
    } else {
      ASSIGN_OR_RETURN(const std::vector<int32_t> ids, ParseIdList(f.String("prompt-tokens"), "--prompt-tokens"));
      req.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
    }
    ASSIGN_OR_RETURN(const int64_t max_tokens, f.Int("max-tokens", 64));
    ASSIGN_OR_RETURN(const double temperature, f.Double("temperature", 0.0));
    ASSIGN_OR_RETURN(const int64_t top_k, f.Int("top-k", 0));
    ASSIGN_OR_RETURN(const int64_t seed, f.Int("seed", 0));
    ASSIGN_OR_RETURN(const int64_t priority, f.Int("priority", 0));
    // Out-of-range values go to the server as given: it is the one that validates.
    req.set_max_new_tokens(static_cast<int32_t>(std::clamp<int64_t>(max_tokens, INT32_MIN, INT32_MAX)));
    req.set_temperature(static_cast<float>(temperature));
    req.set_top_k(static_cast<int32_t>(std::clamp<int64_t>(top_k, INT32_MIN, INT32_MAX)));
    if (f.Has("top-p")) {
      ASSIGN_OR_RETURN(const double top_p, f.Double("top-p", 1.0));
      req.set_top_p(static_cast<float>(top_p));
    }
    if (f.Has("repetition-penalty")) {
      ASSIGN_OR_RETURN(const double penalty, f.Double("repetition-penalty", 1.0));
      req.set_repetition_penalty(static_cast<float>(penalty));
    }
    req.set_seed(static_cast<uint64_t>(seed));
    req.set_priority(static_cast<int32_t>(std::clamp<int64_t>(priority, INT32_MIN, INT32_MAX)));
    if (f.Has("stop")) req.add_stop(f.String("stop"));
    req.set_ignore_eos(f.Has("ignore-eos"));

    auto stub = mer::v1::Mer::NewStub(Channel(addr));
    grpc::ClientContext ctx;
    SetDeadline(&ctx, timeout_ms);
    std::unique_ptr<grpc::ClientReader<mer::v1::GenerateResponse>> reader = stub->Generate(&ctx, req);
    const bool ids_only = f.Has("print-token-ids");
    std::vector<int32_t> ids;
    mer::v1::GenerateResponse resp;
    mer::v1::Final final;
    bool have_final = false;
    while (reader->Read(&resp)) {
      if (resp.has_chunk()) {
        ids.insert(ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
        if (!ids_only && !resp.chunk().text().empty()) {
          std::fwrite(resp.chunk().text().data(), 1, resp.chunk().text().size(), stdout);
          std::fflush(stdout);
        }
      } else if (resp.has_final()) {
        final = resp.final();
        have_final = true;
      }
    }
    const grpc::Status s = reader->Finish();
    if (ids_only) std::printf("%s", absl::StrJoin(ids, " ").c_str());
    if (ids_only || !ids.empty()) std::printf("\n");
    std::fflush(stdout);
    if (!s.ok()) return Report(s);
    if (!have_final) return absl::InternalError("the stream ended without a final message");
    if (f.Has("stats")) {
      const auto& u = final.usage();
      std::fprintf(stderr,
                   "finish_reason=%s prompt_tokens=%d completion_tokens=%d queue_seconds=%.6f "
                   "ttft_seconds=%.6f total_seconds=%.6f\n",
                   FinishName(final.finish_reason()), u.prompt_tokens(), u.completion_tokens(), u.queue_seconds(),
                   u.ttft_seconds(), u.total_seconds());
    }
    return 0;
  };
  absl::StatusOr<int> rc = body();
  if (!rc.ok()) return Fail("client", rc.status());
  return *rc;
}

}  // namespace mer::cli
