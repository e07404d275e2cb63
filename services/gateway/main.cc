// mer-gateway: the public gRPC API of mer (proto/mer/v1/mer.proto), in front of mer-compute's
// internal API on a unix socket; plus grpc.health.v1, server reflection and /metrics for the host.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/daemon_main.h"
#include "common/base/flags.h"
#include "common/base/status.h"
#include "common/metrics/metrics_endpoint.h"
#include "common/systemd/sd_notify.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "services/gateway/compute_client.h"
#include "services/gateway/gateway_metrics.h"
#include "services/gateway/gateway_service.h"
#include "services/gateway/scheduler.h"

#ifndef MER_VERSION
#define MER_VERSION "unknown"
#endif

namespace {

constexpr char kHelp[] =
    R"(usage: mer-gateway --compute unix:PATH [--listen HOST:PORT] [--metrics-listen HOST:PORT|off]
                   [--compute-metrics URL] [--residency-metrics URL] [--max-queue N]
                   [--max-request-bytes N] [--max-call-seconds N]

Serves mer's public gRPC API (mer.v1.Mer: Generate, Tokenize, GetModelInfo; grpc.health.v1;
server reflection) on --listen (default 127.0.0.1:50051; port 0 picks a free one, printed on
stderr as "listening on HOST:PORT") for the mer-compute daemon at unix:PATH. The tokenizer comes
from mer-compute. Up to --max-queue (default 256) Generate calls wait for a sequence slot; more
get RESOURCE_EXHAUSTED. A request message may hold at most --max-request-bytes (default 4 MiB;
a text prompt at most as much); at most 4 calls are read, checked and tokenized at once, so the
gateway's memory stays bounded whatever clients send. A Generate call lasts at most
--max-call-seconds (default 600), whatever deadline its client set, or none: then it ends with
DEADLINE_EXCEEDED. While mer-compute is down, or reports that it cannot generate (its
mer-residency is unreachable), calls get UNAVAILABLE naming the cause and the health status is
NOT_SERVING; compute is polled and used again as soon as it answers. Prometheus metrics are served on
http://HOST:PORT/metrics (default 127.0.0.1:0, printed as "metrics: URL"; off serves none), with
the pages of --compute-metrics and --residency-metrics (their /metrics URLs) merged in, each
series labelled daemon="gateway", "compute" or "residency".
)";


struct Args {
  std::string compute, listen = "127.0.0.1:50051", metrics_listen = "127.0.0.1:0";
  std::string compute_metrics, residency_metrics;
  int64_t max_queue = 256;
  int64_t max_request_bytes = 4 << 20;
  int64_t max_call_seconds = 600;
};

absl::Status ParseArgs(int argc, char** argv, Args* a) {
  ASSIGN_OR_RETURN(const mer::Flags f,
                   mer::Flags::ParseMain(argc, argv,
                                         {"compute", "listen", "metrics-listen", "compute-metrics",
                                          "residency-metrics", "max-queue", "max-request-bytes",
                                          "max-call-seconds"},
                                         {}));
  a->compute = f.String("compute");
  a->listen = f.String("listen", a->listen);
  a->metrics_listen = f.String("metrics-listen", a->metrics_listen);
  a->compute_metrics = f.String("compute-metrics");
  a->residency_metrics = f.String("residency-metrics");
  ASSIGN_OR_RETURN(a->max_queue, f.IntInRange("max-queue", a->max_queue, 0, 1000000));
  ASSIGN_OR_RETURN(a->max_request_bytes,
                   f.IntInRange("max-request-bytes", a->max_request_bytes, 1024, int64_t{1} << 30));
  ASSIGN_OR_RETURN(a->max_call_seconds,
                   f.IntInRange("max-call-seconds", a->max_call_seconds, 1, int64_t{30} * 24 * 3600));
  if (a->compute.rfind("unix:", 0) != 0 || a->compute.size() <= 5)
    return absl::InvalidArgumentError("--compute unix:PATH is required");
  for (const std::string* url : {&a->compute_metrics, &a->residency_metrics}) {
    if (!url->empty() && url->rfind("http://", 0) != 0)
      return absl::InvalidArgumentError(absl::StrCat("metrics URL '", *url, "' is not http://HOST:PORT/PATH"));
  }
  return absl::OkStatus();
}

absl::Status Main(const Args& a) {
  using namespace mer::gateway;
  GatewayMetricsOptions mo;
  mo.version = MER_VERSION;
  mo.compute_metrics_url = a.compute_metrics;
  mo.residency_metrics_url = a.residency_metrics;
  GatewayMetrics metrics(mo);
  SchedulerOptions so;
  so.max_queue = static_cast<int>(a.max_queue);
  Scheduler scheduler(so);
  metrics.SetLoadCallback([&scheduler] { return std::make_pair(scheduler.running(), scheduler.waiting()); });

  ComputeClientOptions co;
  co.target = a.compute;
  ComputeClient compute(co, [&](std::shared_ptr<const ServedModel> model) {
    if (model == nullptr) {
      scheduler.SetUnavailable();
      metrics.SetComputeUp(false);
      return;
    }
    const auto& i = model->info;
    scheduler.SetCapacity(i.max_sequences(), i.kv_budget_tokens());
    metrics.SetComputeUp(true);
    std::fprintf(stderr,
                 "mer-gateway: mer-compute up: %s %s, vocab %d, %d sequences x %d positions, "
                 "KV budget %lld\n",
                 i.architecture().c_str(), i.name().c_str(), i.vocab_size(), i.max_sequences(),
                 i.max_context_tokens(), static_cast<long long>(i.kv_budget_tokens()));
  });
  GatewayOptions go;
  go.limits.max_prompt_bytes = a.max_request_bytes;
  go.max_call_duration = absl::Seconds(a.max_call_seconds);
  GatewayService service(compute, scheduler, &metrics, go);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(a.listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(a.max_request_bytes));
  // A call's request stays with its client until the call's intake reads it: without BDP
  // probing, HTTP/2 flow control holds each stream to its default window (64 KiB) until then,
  // instead of growing the windows until 64 concurrent 4 MB requests lie here unread
  // (gateway_memory_test.sh: peak RSS 105-120 MB without, 260-330 MB with).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", a.listen));
  const std::string host = a.listen.substr(0, a.listen.rfind(':'));

  std::unique_ptr<mer::MetricsEndpoint> endpoint;
  if (a.metrics_listen != "off") {
    ASSIGN_OR_RETURN(endpoint, mer::MetricsEndpoint::Start(a.metrics_listen, metrics.collectables()));
    std::fprintf(stderr, "metrics: %s\n", endpoint->url().c_str());
  }
  std::fprintf(stderr, "mer-gateway: listening on %s:%d\n", host.c_str(), port);
  std::fprintf(stderr, "mer-gateway: ready\n");
  mer::systemd::NotifyReady(absl::StrCat("serving on ", host, ":", port));

  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  mer::systemd::WatchdogPacer watchdog;
  int serving = -1;
  while (!mer::StopRequested().load()) {
    // Serving: mer-compute answers and can generate (its mer-residency is reachable).
    const absl::Status can = compute.serving();
    const int up = can.ok() ? 1 : 0;
    if (up != serving && health != nullptr) {
      health->SetServingStatus(up == 1);
      health->SetServingStatus("mer.v1.Mer", up == 1);
      mer::systemd::NotifyStatus(up == 1 ? "serving" : std::string(can.message()));
      serving = up;
    }
    watchdog.MaybePing([] { return true; });  // this loop turning is the liveness
    absl::SleepFor(absl::Milliseconds(50));
  }
  mer::systemd::NotifyStopping();
  std::fprintf(stderr, "mer-gateway: stopping\n");
  service.BeginShutdown();
  if (health != nullptr) health->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  endpoint.reset();
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  return mer::DaemonMain("mer-gateway", kHelp, argc, argv, ParseArgs, Main);
}
