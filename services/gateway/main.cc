// mer-gateway: the public gRPC API of mer (proto/mer/v1/mer.proto) and the OpenAI-compatible HTTP
// API (http_api.h), in front of mer-compute's internal API on a unix socket; plus grpc.health.v1,
// server reflection and /metrics for the host.
#include <malloc.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
#include "services/gateway/http_api.h"
#include "services/gateway/scheduler.h"

#ifndef MER_VERSION
#define MER_VERSION "unknown"
#endif

namespace {

constexpr char kHelp[] =
    R"(usage: mer-gateway --compute unix:PATH [--listen HOST:PORT] [--http-listen HOST:PORT|off]
                   [--served-model-name NAME] [--metrics-listen HOST:PORT|off]
                   [--compute-metrics URL] [--residency-metrics URL[,URL...]] [--max-queue N]
                   [--max-request-bytes N] [--max-call-seconds N]

Serves mer's public gRPC API (mer.v1.Mer: Generate, Tokenize, Detokenize, GetModelInfo;
grpc.health.v1; server reflection) on --listen (default 127.0.0.1:50051; port 0 picks a free one,
printed on stderr as "listening on HOST:PORT") for the mer-compute daemon at unix:PATH. The
tokenizer comes from mer-compute. Up to --max-queue (default 256) Generate calls wait for a
sequence slot; more get RESOURCE_EXHAUSTED. A request message may hold at most
--max-request-bytes (default 4 MiB; a text prompt at most as much; an HTTP request body twice as
much, for JSON's escapes); at most 4 requests are read, checked and tokenized at once, over both
APIs, so the gateway's memory stays bounded whatever clients send. A generation lasts at most
--max-call-seconds (default 600), whatever deadline its client set, or none: then it ends with
DEADLINE_EXCEEDED (HTTP 504). While mer-compute is down, or reports that it cannot generate (its
mer-residency is unreachable), calls get UNAVAILABLE (HTTP 503) naming the cause and the health
status is NOT_SERVING (HTTP /health 503); compute is polled and used again as soon as it answers.
The OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, /health,
/tokenize, /detokenize) is served on --http-listen (default 127.0.0.1:8080; port 0 picks a free
one, printed as "http: URL"; off serves none), under the model id --served-model-name (default:
the model's general.name), from the same queue as the gRPC API. Prometheus metrics are served on
http://HOST:PORT/metrics (default 127.0.0.1:0, printed as "metrics: URL"; off serves none), with
the pages of --compute-metrics and --residency-metrics (their /metrics URLs) merged in, each
series labelled daemon="gateway", "compute" or "residency". --residency-metrics may list several
URLs, comma-separated: one per mer-residency instance of mer-compute's expert ranks, rank r's the
r-th, whose series are then also labelled rank="r".
)";

struct Args {
  std::string compute, listen = "127.0.0.1:50051", metrics_listen = "127.0.0.1:0";
  std::string http_listen = "127.0.0.1:8080", served_model_name;
  std::string compute_metrics;
  std::vector<std::string> residency_metrics;  // one per mer-residency instance
  int64_t max_queue = 256;
  int64_t max_request_bytes = 4 << 20;
  int64_t max_call_seconds = 600;
};

absl::Status ParseArgs(int argc, char** argv, Args* a) {
  ASSIGN_OR_RETURN(const mer::Flags f, mer::Flags::ParseMain(argc, argv,
                                                             {"compute", "listen", "http-listen", "served-model-name",
                                                              "metrics-listen", "compute-metrics", "residency-metrics",
                                                              "max-queue", "max-request-bytes", "max-call-seconds"},
                                                             {}));
  a->compute = f.String("compute");
  a->listen = f.String("listen", a->listen);
  a->http_listen = f.String("http-listen", a->http_listen);
  a->served_model_name = f.String("served-model-name");
  a->metrics_listen = f.String("metrics-listen", a->metrics_listen);
  a->compute_metrics = f.String("compute-metrics");
  a->residency_metrics = absl::StrSplit(f.String("residency-metrics"), ',', absl::SkipEmpty());
  ASSIGN_OR_RETURN(a->max_queue, f.IntInRange("max-queue", a->max_queue, 0, 1000000));
  ASSIGN_OR_RETURN(a->max_request_bytes,
                   f.IntInRange("max-request-bytes", a->max_request_bytes, 1024, int64_t{1} << 30));
  ASSIGN_OR_RETURN(a->max_call_seconds,
                   f.IntInRange("max-call-seconds", a->max_call_seconds, 1, int64_t{30} * 24 * 3600));
  if (a->compute.rfind("unix:", 0) != 0 || a->compute.size() <= 5)
    return absl::InvalidArgumentError("--compute unix:PATH is required");
  std::vector<std::string> urls = a->residency_metrics;
  urls.push_back(a->compute_metrics);
  for (const std::string& url : urls) {
    if (!url.empty() && url.rfind("http://", 0) != 0)
      return absl::InvalidArgumentError(absl::StrCat("metrics URL '", url, "' is not http://HOST:PORT/PATH"));
  }
  return absl::OkStatus();
}

absl::Status Main(const Args& a) {
  using namespace mer::gateway;
  // Request buffers (bodies, messages, prompts: up to a few MB each) are mapped for themselves
  // and unmapped when freed. glibc's default threshold grows to the largest freed block, after
  // which such buffers come from per-thread arenas that keep them: after 64 concurrent 4 MB
  // prompts over HTTP (64 server threads) the gateway then stayed at 240-330 MB; with a fixed
  // threshold its peak is 80-115 MB and it returns to 25-55 MB (gateway_memory_test.sh).
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  GatewayMetricsOptions mo;
  mo.version = MER_VERSION;
  mo.compute_metrics_url = a.compute_metrics;
  mo.residency_metrics_urls = a.residency_metrics;
  GatewayMetrics metrics(mo);
  SchedulerOptions so;
  so.max_queue = static_cast<int>(a.max_queue);
  Scheduler scheduler(so);
  metrics.SetLoadCallback([&scheduler] { return std::make_pair(scheduler.running(), scheduler.waiting()); });
  metrics.SetKvUsageCallback([&scheduler] { return scheduler.kv_usage(); });

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
    metrics.SetModelName(ServedModelId(*model, a.served_model_name));
    metrics.SetComputeUp(true);
    std::fprintf(stderr,
                 "mer-gateway: mer-compute up: %s %s, vocab %d, %d sequences x %d positions, "
                 "KV budget %lld\n",
                 i.architecture().c_str(), i.name().c_str(), i.vocab_size(), i.max_sequences(), i.max_context_tokens(),
                 static_cast<long long>(i.kv_budget_tokens()));
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
  // (gateway_memory_test.sh: peak RSS 85-90 MB without, 220-250 MB with).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", a.listen));
  const std::string host = a.listen.substr(0, a.listen.rfind(':'));

  std::unique_ptr<HttpApi> http;
  if (a.http_listen != "off") {
    HttpApiOptions ho;
    ho.listen = a.http_listen;
    ho.served_model_name = a.served_model_name;
    ho.max_body_bytes = 2 * static_cast<size_t>(a.max_request_bytes);
    ASSIGN_OR_RETURN(http, HttpApi::Start(service, compute, ho));
    std::fprintf(stderr, "http: http://%s:%d\n", http->host().c_str(), http->port());
  }

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
  http.reset();
  endpoint.reset();
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) { return mer::DaemonMain("mer-gateway", kHelp, argc, argv, ParseArgs, Main); }
