// mer-gateway's OpenAI-compatible HTTP API (docs/api.md, "HTTP API"), on cpp-httplib:
//   POST /v1/completions, /v1/chat/completions (JSON, or Server-Sent Events with "stream": true)
//   GET  /v1/models, /health
//   POST /tokenize, /detokenize
// Every generation goes through GatewayService::Run, the path of the gRPC API's Generate:
// the same validation, admission queue, compute call, stop sequences and metrics. A chat request
// is rendered with the model's chat template (tokenizer.chat_template; ChatML when the model has
// none), and with a template that knows Qwen3's <think> block the reply's reasoning comes back as
// `reasoning_content`, apart from `content`.
//
// Errors are OpenAI's JSON {"error": {"message", "type", "param", "code"}}: 400 for a bad request
// (invalid JSON, wrong types, values out of range, naming the parameter), 404 for an unknown model
// or route, 413 for a body over max_body_bytes, 429 when the queue is full, 503 while mer-compute
// is down or cannot generate (its mer-residency is unreachable: /health says 503 then too, as the
// gRPC health status says NOT_SERVING), 504 past the gateway's maximum call duration. A stream
// that fails after its first event ends with an error event and "[DONE]".
//
// Memory: a request's body is read (with a content reader, not before the handler runs), parsed,
// rendered and tokenized in an intake turn of the GatewayService (BeginIntake), so the HTTP API
// holds as few request bodies and tokenizations at once as the gRPC API; a text prompt is checked
// against the context before it is tokenized (CheckPromptText).
//
// Threads: httplib's pool (http_threads) serves connections, one request at a time each; a
// streaming request runs each of its choices on a thread of its own, so that the handler can
// answer with the right status when the generation fails before its first token.
//
// Thread-safety: constructed and destroyed on one thread; the handlers run concurrently and touch
// only thread-safe members (the service, the compute client, the template cache under its mutex).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/chat/chat_template.h"
#include "services/gateway/compute_client.h"
#include "services/gateway/gateway_service.h"
#include "services/gateway/openai_request.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace mer::gateway {

struct HttpApiOptions {
  std::string listen = "127.0.0.1:8080";  // HOST:PORT; port 0 picks a free one
  std::string served_model_name;          // the model's id in the API; empty: its general.name
  size_t max_body_bytes = 8 << 20;        // larger request bodies get 413 (mer-gateway: 2 x --max-request-bytes)
  int http_threads = 64;                  // connections served at once
  openai::Limits limits;
};

// The id the APIs give `model`: `served_name` when set, else its general.name, else "mer".
std::string ServedModelId(const ServedModel& model, const std::string& served_name);

class HttpApi {
 public:
  // Binds and starts serving. Unavailable when the address cannot be bound. `service` and
  // `compute` outlive the HttpApi.
  static absl::StatusOr<std::unique_ptr<HttpApi>> Start(GatewayService& service, ComputeClient& compute,
                                                        const HttpApiOptions& options);
  ~HttpApi();  // stops accepting, waits for the handlers

  int port() const { return port_; }
  const std::string& host() const { return options_.listen_host; }

  // The id the API gives `model` (the served name, or its general.name, or "mer").
  std::string ModelId(const ServedModel& model) const;

 private:
  struct Resolved : HttpApiOptions {
    std::string listen_host;
  };
  HttpApi(GatewayService& service, ComputeClient& compute, Resolved options);
  void Routes();
  absl::StatusOr<std::shared_ptr<const ChatTemplate>> TemplateFor(const ServedModel& model);

  GatewayService& service_;
  ComputeClient& compute_;
  const Resolved options_;
  const int64_t created_;  // unix time of the start, the models' "created"
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread thread_;

  absl::Mutex mu_;
  std::string template_source_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const ChatTemplate> template_ ABSL_GUARDED_BY(mu_);
};

}  // namespace mer::gateway
