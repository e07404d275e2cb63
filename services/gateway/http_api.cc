#include "services/gateway/http_api.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/chat/tool_calls.h"
#include "httplib.h"
#include "services/gateway/request_validation.h"
#include "services/gateway/text_stream.h"

namespace mer::gateway {

using openai::Json;

namespace {

// ChatML, for models whose file carries no chat template (as llama-server falls back to it).
constexpr char kChatMlTemplate[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + "
    "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

constexpr char kJson[] = "application/json";

void SendError(httplib::Response& res, const absl::Status& status) {
  const openai::HttpError e = openai::ErrorFromStatus(status);
  res.status = e.status;
  res.set_content(e.body, kJson);
}

std::string RandomId(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(std::string(prefix), absl::Hex(rng(), absl::kZeroPad16), absl::Hex(rng() >> 32, absl::kZeroPad8));
}

// Valid UTF-8 of arbitrary bytes (invalid ones become U+FFFD), for token strings.
std::string Utf8(std::string_view bytes) {
  TextStream t;
  std::string s = t.Append(absl::string_view(bytes.data(), bytes.size()));
  return s + t.Finish();
}

Json Bytes(std::string_view bytes) {
  Json b = Json::array();
  for (char c : bytes) b.push_back(static_cast<unsigned char>(c));
  return b;
}

const char* FinishReason(const mer::v1::Final& f) {
  switch (f.finish_reason()) {
    case mer::v1::FINISH_REASON_LENGTH:
      return "length";
    case mer::v1::FINISH_REASON_EOS:
    case mer::v1::FINISH_REASON_STOP:
      return "stop";
    default:
      return "abort";
  }
}

// A choice that returned tool calls and ended by itself ended to have them run (OpenAI's
// "tool_calls").
const char* FinishReason(const mer::v1::Final& f, int tool_calls) {
  if (tool_calls > 0 &&
      (f.finish_reason() == mer::v1::FINISH_REASON_EOS || f.finish_reason() == mer::v1::FINISH_REASON_STOP))
    return "tool_calls";
  return FinishReason(f);
}

// OpenAI's `tool_calls` entries; `first` numbers them within their choice (index) and names them.
Json ToolCallsJson(const std::vector<mer::ToolCall>& calls, int first, const std::string& id) {
  Json out = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const int index = first + static_cast<int>(i);
    out.push_back(Json{{"index", index},
                       {"id", absl::StrCat("call_", id, "_", index)},
                       {"type", "function"},
                       {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}});
  }
  return out;
}

// vLLM's stop_reason: the stop token or stop string that ended the choice; null otherwise.
Json StopReason(const mer::v1::Final& f) {
  if (f.finish_reason() == mer::v1::FINISH_REASON_EOS) return f.stop_token_id();
  if (f.finish_reason() == mer::v1::FINISH_REASON_STOP) return f.stop_sequence();
  return nullptr;
}

// The per-token logprobs of a chunk, in the endpoint's shape.
Json ChatLogprobs(const mer::v1::Chunk& c, const Tokenizer& tok) {
  Json content = Json::array();
  for (int i = 0; i < c.logprobs_size() && i < c.token_ids_size(); ++i) {
    const mer::v1::TokenLogprob& lp = c.logprobs(i);
    const std::string bytes = tok.TokenBytes(c.token_ids(i));
    Json top = Json::array();
    for (int k = 0; k < lp.top_ids_size(); ++k) {
      const std::string tb = tok.TokenBytes(lp.top_ids(k));
      top.push_back({{"token", Utf8(tb)}, {"logprob", lp.top_logprobs(k)}, {"bytes", Bytes(tb)}});
    }
    content.push_back(
        {{"token", Utf8(bytes)}, {"logprob", lp.logprob()}, {"bytes", Bytes(bytes)}, {"top_logprobs", top}});
  }
  return Json{{"content", std::move(content)}};
}

Json CompletionLogprobs(const mer::v1::Chunk& c, const Tokenizer& tok, size_t* text_offset) {
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  for (int i = 0; i < c.logprobs_size() && i < c.token_ids_size(); ++i) {
    const mer::v1::TokenLogprob& lp = c.logprobs(i);
    tokens.push_back(Utf8(tok.TokenBytes(c.token_ids(i))));
    token_logprobs.push_back(lp.logprob());
    Json alternatives = Json::object();
    for (int k = 0; k < lp.top_ids_size(); ++k) alternatives[Utf8(tok.TokenBytes(lp.top_ids(k)))] = lp.top_logprobs(k);
    top.push_back(std::move(alternatives));
    offsets.push_back(*text_offset);
    *text_offset += tok.TokenPiece(c.token_ids(i)).size();
  }
  return Json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top}, {"text_offset", offsets}};
}

// One choice of a request: what its generation needs, and what its output has become so far.
struct Choice {
  int index = 0;
  mer::v1::GenerateRequest request;  // prompt as token ids
  int prompt_tokens = 0;
  bool count_prompt = true;                    // the first choice of its prompt: usage counts its prompt once
  std::unique_ptr<ReasoningStream> reasoning;  // chat with a reasoning template
  std::unique_ptr<ToolCallStream> tools;       // chat with tools (ParsedRequest::parse_tool_calls)
  std::string call_id;                         // what the choice's tool call ids start with
  size_t text_offset = 0;
  // Non-streaming output.
  std::string text;
  std::string reasoning_text;
  Json logprobs;  // accumulated, or null
  mer::v1::Final final;
  absl::Status status;
};

// A request after parsing: its choices, and how their events are formatted.
struct Job {
  openai::ParsedRequest parsed;
  std::string id;
  std::string model_id;
  int64_t created = 0;
  std::shared_ptr<const ServedModel> model;
  std::vector<std::unique_ptr<Choice>> choices;
  bool chat() const { return parsed.endpoint == openai::Endpoint::kChatCompletions; }

  Json ChunkEnvelope() const {
    return Json{{"id", id},
                {"object", chat() ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", model_id}};
  }

  // The stream events of one message of a choice's generation (maybe none).
  std::vector<std::string> Events(Choice& c, const mer::v1::GenerateResponse& r, bool first) {
    std::vector<std::string> out;
    auto emit = [&](Json choice) {
      Json e = ChunkEnvelope();
      e["choices"] = Json::array({std::move(choice)});
      out.push_back(e.dump(-1, ' ', false, Json::error_handler_t::replace));
    };
    if (first && chat()) {
      emit(Json{{"index", c.index},
                {"delta", {{"role", "assistant"}, {"content", ""}}},
                {"logprobs", nullptr},
                {"finish_reason", nullptr}});
    }
    if (r.has_chunk()) {
      const mer::v1::Chunk& k = r.chunk();
      Json lp = nullptr;
      if (parsed.logprobs && k.logprobs_size() > 0)
        lp = chat() ? ChatLogprobs(k, model->tokenizer) : CompletionLogprobs(k, model->tokenizer, &c.text_offset);
      if (chat()) {
        Json delta = Json::object();
        if (c.reasoning != nullptr) {
          const ReasoningStream::Delta d = c.reasoning->Append(k.text());
          if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
          AddContent(c, d.content, false, &delta);
        } else {
          AddContent(c, k.text(), false, &delta);
        }
        if (!delta.empty() || !lp.is_null())
          emit(Json{{"index", c.index}, {"delta", delta}, {"logprobs", lp}, {"finish_reason", nullptr}});
      } else if (!k.text().empty() || !lp.is_null()) {
        emit(Json{{"index", c.index}, {"text", k.text()}, {"logprobs", lp}, {"finish_reason", nullptr}});
      }
    } else if (r.has_final()) {
      const mer::v1::Final& f = r.final();
      Json delta = Json::object();
      std::string content;
      if (c.reasoning != nullptr) {
        const ReasoningStream::Delta d = c.reasoning->Finish();
        if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
        content = d.content;
      }
      if (chat()) AddContent(c, content, true, &delta);
      Json choice = {{"index", c.index}};
      if (chat())
        choice["delta"] = delta;
      else
        choice["text"] = "";
      choice["logprobs"] = nullptr;
      choice["finish_reason"] = FinishReason(f, c.tools != nullptr ? c.tools->calls() : 0);
      choice["stop_reason"] = StopReason(f);
      emit(std::move(choice));
    }
    return out;
  }

  // Adds streamed reply content to a delta: as it is, or split into text and tool calls; `last`
  // flushes what the split holds.
  static void AddContent(Choice& c, std::string_view content, bool last, Json* delta) {
    if (c.tools == nullptr) {
      if (!content.empty()) (*delta)["content"] = std::string(content);
      return;
    }
    const int before = c.tools->calls();
    ToolCallStream::Delta t = c.tools->Append(content);
    if (last) {
      ToolCallStream::Delta tail = c.tools->Finish();
      t.content += tail.content;
      for (ToolCall& call : tail.calls) t.calls.push_back(std::move(call));
    }
    if (!t.content.empty()) (*delta)["content"] = t.content;
    if (!t.calls.empty()) (*delta)["tool_calls"] = ToolCallsJson(t.calls, before, c.call_id);
  }

  Json Usage() const {
    int prompt = 0, completion = 0;
    for (const auto& c : choices) {
      if (c->count_prompt) prompt += c->prompt_tokens;
      completion += c->final.usage().completion_tokens();
    }
    return Json{{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
  }

  // The non-streaming response.
  Json Response() const {
    Json out = {{"id", id},
                {"object", chat() ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", model_id}};
    Json list = Json::array();
    for (const auto& c : choices) {
      Json choice = {{"index", c->index}};
      int tool_calls = 0;
      if (chat()) {
        Json message = {{"role", "assistant"}, {"content", c->text}};
        if (c->tools != nullptr) {
          ToolCallStream::Delta t = c->tools->Append(c->text);
          ToolCallStream::Delta tail = c->tools->Finish();
          t.content += tail.content;
          for (ToolCall& call : tail.calls) t.calls.push_back(std::move(call));
          tool_calls = static_cast<int>(t.calls.size());
          if (tool_calls > 0) {
            message["content"] = t.content.empty() ? Json(nullptr) : Json(t.content);
            message["tool_calls"] = ToolCallsJson(t.calls, 0, c->call_id);
          }
        }
        if (c->reasoning != nullptr)
          message["reasoning_content"] = c->reasoning_text.empty() ? Json(nullptr) : Json(c->reasoning_text);
        choice["message"] = std::move(message);
      } else {
        choice["text"] = c->text;
      }
      choice["logprobs"] = c->logprobs;
      choice["finish_reason"] = FinishReason(c->final, tool_calls);
      choice["stop_reason"] = StopReason(c->final);
      list.push_back(std::move(choice));
    }
    out["choices"] = std::move(list);
    out["usage"] = Usage();
    return out;
  }
};

// A non-streaming choice: collects the output.
class CollectSink final : public GenerateSink {
 public:
  CollectSink(Job& job, Choice& c) : job_(job), c_(c) {}
  bool Write(const mer::v1::GenerateResponse& r) override {
    if (r.has_final()) {
      c_.final = r.final();
      if (c_.reasoning != nullptr) {
        ReasoningStream::Delta d = c_.reasoning->Append(raw_);
        const ReasoningStream::Delta tail = c_.reasoning->Finish();
        c_.reasoning_text = d.reasoning + tail.reasoning;
        c_.text = d.content + tail.content;
      } else {
        c_.text = raw_;
      }
      return true;
    }
    const mer::v1::Chunk& k = r.chunk();
    raw_ += k.text();
    if (job_.parsed.logprobs && k.logprobs_size() > 0) {
      if (job_.chat()) {
        if (c_.logprobs.is_null()) c_.logprobs = Json{{"content", Json::array()}};
        const Json lp = ChatLogprobs(k, job_.model->tokenizer);
        for (const auto& item : lp["content"]) c_.logprobs["content"].push_back(item);
      } else {
        const Json lp = CompletionLogprobs(k, job_.model->tokenizer, &c_.text_offset);
        if (c_.logprobs.is_null())
          c_.logprobs = Json{{"tokens", Json::array()},
                             {"token_logprobs", Json::array()},
                             {"top_logprobs", Json::array()},
                             {"text_offset", Json::array()}};
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
          for (const auto& item : lp[key]) c_.logprobs[key].push_back(item);
      }
    }
    return true;
  }
  bool ClientGone() override { return false; }  // found out only when the response is written

 private:
  Job& job_;
  Choice& c_;
  std::string raw_;
};

// The events of a streaming request, from its choices' threads to the connection's thread.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> events;  // SSE data payloads
  int running = 0;                 // choices still generating
  bool any_event = false;
  absl::Status first_error;  // of a choice that failed
  std::atomic<bool> client_gone{false};
  std::vector<std::thread> threads;

  void Push(std::vector<std::string> e) {
    if (e.empty()) return;
    std::lock_guard<std::mutex> lock(mu);
    for (auto& s : e) events.push_back(std::move(s));
    any_event = true;
    cv.notify_all();
  }
  void JoinAll() {
    for (std::thread& t : threads)
      if (t.joinable()) t.join();
  }
};

class StreamSink final : public GenerateSink {
 public:
  StreamSink(Job& job, Choice& c, Stream& s) : job_(job), c_(c), s_(s) {}
  bool Write(const mer::v1::GenerateResponse& r) override {
    if (s_.client_gone.load()) return false;
    if (r.has_final()) c_.final = r.final();
    s_.Push(job_.Events(c_, r, first_));
    first_ = false;
    return true;
  }
  bool ClientGone() override { return s_.client_gone.load(); }

 private:
  Job& job_;
  Choice& c_;
  Stream& s_;
  bool first_ = true;
};

// A turn in the gateway's intake (GatewayService::BeginIntake), given back when this goes.
class IntakeTurn {
 public:
  explicit IntakeTurn(GatewayService& service) : service_(service) {}
  ~IntakeTurn() { End(); }
  IntakeTurn(const IntakeTurn&) = delete;
  IntakeTurn& operator=(const IntakeTurn&) = delete;
  absl::Status Begin() {
    RETURN_IF_ERROR(service_.BeginIntake(nullptr, absl::Now() + service_.options().max_call_duration));
    held_ = true;
    return absl::OkStatus();
  }
  void End() {
    if (held_) service_.EndIntake();
    held_ = false;
  }

 private:
  GatewayService& service_;
  bool held_ = false;
};

// Reads the request body with `content` (into a buffer of its Content-Length): false, with the
// error response set, when it cannot be read or is longer than max_body_bytes (httplib's payload
// limit; it answers 413 then).
bool ReadBody(const httplib::Request& req, const httplib::ContentReader& content, size_t max_body_bytes,
              httplib::Response& res, std::string* body) {
  if (size_t length = 0; absl::SimpleAtoi(req.get_header_value("Content-Length"), &length))
    body->reserve(std::min(length, max_body_bytes));
  if (content([body](const char* data, size_t n) {
        body->append(data, n);
        return true;
      }))
    return true;
  if (res.status == 413) {
    res.set_content(openai::ErrorBody("the request body is too large", "invalid_request_error", ""), kJson);
  } else {
    res.status = 400;
    res.set_content(openai::ErrorBody("the request body cannot be read", "invalid_request_error", ""), kJson);
  }
  return false;
}

// Reads the body as ReadBody does and parses it as a JSON object: false, with the error response
// set, when it cannot be read or is not one.
bool ReadJsonObject(const httplib::Request& req, const httplib::ContentReader& content, size_t max_body_bytes,
                    httplib::Response& res, Json* body) {
  std::string raw;
  if (!ReadBody(req, content, max_body_bytes, res, &raw)) return false;
  *body = Json::parse(raw, nullptr, false);
  if (body->is_discarded() || !body->is_object()) {
    SendError(res, absl::InvalidArgumentError("body: not a JSON object"));
    return false;
  }
  return true;
}

absl::Status ParseListen(const std::string& listen, std::string* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(listen.substr(colon + 1), port) || *port < 0 || *port > 65535)
    return absl::InvalidArgumentError(absl::StrCat("--http-listen '", listen, "' is not HOST:PORT"));
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpApi>> HttpApi::Start(GatewayService& service, ComputeClient& compute,
                                                        const HttpApiOptions& options) {
  Resolved r;
  static_cast<HttpApiOptions&>(r) = options;
  int port = 0;
  RETURN_IF_ERROR(ParseListen(options.listen, &r.listen_host, &port));
  std::unique_ptr<HttpApi> api(new HttpApi(service, compute, std::move(r)));
  httplib::Server& s = *api->server_;
  const int threads = std::max(1, options.http_threads);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(options.max_body_bytes);
  s.set_tcp_nodelay(true);
  api->Routes();
  if (port == 0) {
    api->port_ = s.bind_to_any_port(api->options_.listen_host);
  } else {
    api->port_ = s.bind_to_port(api->options_.listen_host, port) ? port : -1;
  }
  if (api->port_ <= 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen, " (HTTP)"));
  HttpApi* self = api.get();
  api->thread_ = std::thread([self] { self->server_->listen_after_bind(); });
  return api;
}

HttpApi::HttpApi(GatewayService& service, ComputeClient& compute, Resolved options)
    : service_(service),
      compute_(compute),
      options_(std::move(options)),
      created_(static_cast<int64_t>(std::time(nullptr))),
      server_(std::make_unique<httplib::Server>()) {}

HttpApi::~HttpApi() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

std::string ServedModelId(const ServedModel& model, const std::string& served_name) {
  if (!served_name.empty()) return served_name;
  return model.info.name().empty() ? "mer" : model.info.name();
}

std::string HttpApi::ModelId(const ServedModel& model) const {
  return ServedModelId(model, options_.served_model_name);
}

absl::StatusOr<std::shared_ptr<const ChatTemplate>> HttpApi::TemplateFor(const ServedModel& model) {
  const std::string& source = model.chat_template.empty() ? std::string(kChatMlTemplate) : model.chat_template;
  {
    absl::MutexLock lock(&mu_);
    if (template_ != nullptr && template_source_ == source) return template_;
  }
  absl::StatusOr<ChatTemplate> parsed = ChatTemplate::Parse(source);
  if (!parsed.ok())
    return absl::FailedPreconditionError(absl::StrCat("the model's chat template: ", parsed.status().message()));
  auto t = std::make_shared<const ChatTemplate>(std::move(*parsed));
  absl::MutexLock lock(&mu_);
  template_source_ = source;
  template_ = t;
  return t;
}

void HttpApi::Routes() {
  httplib::Server& s = *server_;

  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = absl::StrCat("HTTP ", res.status);
    std::string type = "invalid_request_error";
    if (res.status == 404) message = absl::StrCat("no route ", req.method, " ", req.path);
    if (res.status == 413) message = "the request body is too large";
    if (res.status >= 500) type = "server_error";
    res.set_content(openai::ErrorBody(message, type, ""), kJson);
  });
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    res.status = 500;
    res.set_content(openai::ErrorBody("internal error", "server_error", ""), kJson);
  });

  // The gRPC health status's signal: mer-compute is up and can generate (its mer-residency is
  // reachable).
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (absl::Status st = compute_.serving(); !st.ok()) return SendError(res, st);
    res.set_content(R"({"status":"ok"})", kJson);
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const std::shared_ptr<const ServedModel> model = compute_.model();
    if (model == nullptr) return SendError(res, absl::UnavailableError("mer-compute is not available"));
    Json m = {{"id", ModelId(*model)},
              {"object", "model"},
              {"created", created_},
              {"owned_by", "mer"},
              {"max_model_len", model->info.max_context_tokens()}};
    res.set_content(Json{{"object", "list"}, {"data", Json::array({m})}}.dump(), kJson);
  });

  s.Post("/tokenize",
         [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& content) {
           const std::shared_ptr<const ServedModel> model = compute_.model();
           if (model == nullptr) return SendError(res, absl::UnavailableError("mer-compute is not available"));
           IntakeTurn turn(service_);
           if (absl::Status st = turn.Begin(); !st.ok()) return SendError(res, st);
           Json body;
           if (!ReadJsonObject(req, content, options_.max_body_bytes, res, &body)) return;
           // vLLM's "prompt" or llama-server's "content"; "add_special_tokens" (vLLM) or "add_special".
           const auto text = body.contains("prompt") ? body.find("prompt") : body.find("content");
           if (text == body.end() || !text->is_string())
             return SendError(res, absl::InvalidArgumentError("prompt: must be a string"));
           bool add_special = false;
           for (const char* key : {"add_special_tokens", "add_special"}) {
             const auto v = body.find(key);
             if (v == body.end()) continue;
             if (!v->is_boolean())
               return SendError(res, absl::InvalidArgumentError(absl::StrCat(key, ": must be a boolean")));
             add_special = v->get<bool>();
           }
           mer::v1::TokenizeRequest treq;
           treq.set_text(text->get<std::string>());
           treq.set_add_special(add_special);
           mer::v1::TokenizeResponse tres;
           if (absl::Status st = service_.TokenizeImpl(treq, &tres); !st.ok()) return SendError(res, st);
           const std::vector<int32_t> ids(tres.token_ids().begin(), tres.token_ids().end());
           res.set_content(
               Json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model->info.max_context_tokens()}}.dump(),
               kJson);
         });

  s.Post("/detokenize",
         [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& content) {
           IntakeTurn turn(service_);
           if (absl::Status st = turn.Begin(); !st.ok()) return SendError(res, st);
           Json body;
           if (!ReadJsonObject(req, content, options_.max_body_bytes, res, &body)) return;
           const auto tokens = body.find("tokens");
           if (tokens == body.end() || !tokens->is_array())
             return SendError(res, absl::InvalidArgumentError("tokens: must be an array of token ids"));
           mer::v1::DetokenizeRequest dreq;
           for (size_t i = 0; i < tokens->size(); ++i) {
             const Json& t = (*tokens)[i];
             if (!t.is_number_integer() || t.get<int64_t>() < INT32_MIN || t.get<int64_t>() > INT32_MAX)
               return SendError(res, absl::InvalidArgumentError(absl::StrCat("tokens[", i, "]: must be a token id")));
             dreq.add_token_ids(static_cast<int32_t>(t.get<int64_t>()));
           }
           mer::v1::DetokenizeResponse dres;
           if (absl::Status st = service_.DetokenizeImpl(dreq, &dres); !st.ok()) return SendError(res, st);
           // "prompt" as vLLM answers, "content" as llama-server does.
           res.set_content(Json{{"prompt", dres.text()}, {"content", dres.text()}}.dump(-1, ' ', false,
                                                                                        Json::error_handler_t::replace),
                           kJson);
         });

  auto generate = [this](openai::Endpoint endpoint) {
    return
        [this, endpoint](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& content) {
          // The body is read, parsed, rendered and tokenized in an intake turn, as gRPC's requests
          // are; what outlives the turn is the choices' token ids.
          IntakeTurn turn(service_);
          if (absl::Status st = turn.Begin(); !st.ok()) return SendError(res, st);
          auto job = std::make_shared<Job>();
          {
            std::string body;
            if (!ReadBody(req, content, options_.max_body_bytes, res, &body)) return;
            absl::StatusOr<openai::ParsedRequest> parsed = openai::ParseRequest(endpoint, body, options_.limits);
            if (!parsed.ok()) return SendError(res, parsed.status());
            job->parsed = std::move(*parsed);
          }
          job->model = compute_.model();
          if (job->model == nullptr) return SendError(res, absl::UnavailableError("mer-compute is not available"));
          if (absl::Status st = compute_.serving(); !st.ok()) return SendError(res, st);
          job->model_id = ModelId(*job->model);
          if (!job->parsed.model.empty() && job->parsed.model != job->model_id)
            return SendError(
                res, absl::NotFoundError(absl::StrCat("The model `", job->parsed.model,
                                                      "` does not exist; this server serves `", job->model_id, "`")));
          job->id = RandomId(job->chat() ? "chatcmpl-" : "cmpl-");
          job->created = static_cast<int64_t>(std::time(nullptr));
          const Tokenizer& tok = job->model->tokenizer;
          const int32_t ctx = job->model->info.max_context_tokens();

          // The prompts, as token ids.
          std::vector<mer::v1::GenerateRequest> prompts = std::move(job->parsed.prompts);
          bool reasoning = false, opens_reasoning = false;
          if (job->chat()) {
            absl::StatusOr<std::shared_ptr<const ChatTemplate>> t = TemplateFor(*job->model);
            if (!t.ok()) return SendError(res, t.status());
            ChatTemplateInputs in;
            in.messages = std::move(job->parsed.messages);
            in.tools = std::move(job->parsed.tools);
            in.add_generation_prompt = job->parsed.add_generation_prompt;
            in.enable_thinking = job->parsed.enable_thinking;
            in.extra = job->parsed.chat_template_kwargs;
            in.bos_token = tok.bos_id() >= 0 ? std::string(tok.TokenText(tok.bos_id())) : "";
            in.eos_token = tok.eos_id() >= 0 ? std::string(tok.TokenText(tok.eos_id())) : "";
            absl::StatusOr<std::string> prompt = (*t)->Render(in);
            if (!prompt.ok())
              return SendError(res, absl::InvalidArgumentError(absl::StrCat("messages: ", prompt.status().message())));
            reasoning = (*t)->has_reasoning();
            opens_reasoning = PromptOpensReasoning(*prompt);
            prompts.emplace_back().set_text(*prompt);
          }
          std::mt19937_64 seeds(std::random_device{}());
          const ModelLimits limits{job->model->info.vocab_size(), ctx, job->model->info.kv_budget_tokens(),
                                   job->model->max_token_bytes};
          const RequestLimits& request_limits = service_.options().limits;
          // A message as the gRPC path words it, with the API's names for the fields.
          auto bad_request = [&](size_t p, const absl::Status& st) {
            const std::string prefix = job->chat() ? "" : (prompts.size() > 1 ? absl::StrCat("prompt[", p, "]: ") : "");
            std::string message(st.message());
            if (message.rfind("max_new_tokens:", 0) == 0) message.replace(0, 14, "max_tokens");
            return SendError(res, absl::Status(st.code(), prefix + message));
          };
          for (size_t p = 0; p < prompts.size(); ++p) {
            mer::v1::GenerateRequest g = job->parsed.options;
            std::vector<int32_t> ids;
            if (prompts[p].has_text()) {
              // Bounded before the tokenizer's working set is allocated (request_validation.h).
              // (A chat prompt that starts with BOS keeps no other: no BOS counted for chat.)
              const bool bos = tok.add_bos() && tok.bos_id() >= 0;
              if (absl::Status st = CheckPromptText(prompts[p].text(), bos && !job->chat(), limits, request_limits);
                  !st.ok())
                return bad_request(p, st);
              // A chat prompt carries its own special tokens (the template wrote them); BOS only
              // where the vocabulary asks for it and the text does not start with it.
              if (bos) ids.push_back(tok.bos_id());
              const std::vector<int32_t> text = tok.Encode(prompts[p].text(), /*parse_special=*/true);
              if (job->chat() && !text.empty() && !ids.empty() && text[0] == ids[0]) ids.clear();
              ids.insert(ids.end(), text.begin(), text.end());
              if (ids.empty())
                return SendError(res, absl::InvalidArgumentError(job->chat() ? "messages: render to no tokens"
                                                                             : "prompt: tokenizes to no tokens"));
            } else {
              ids.assign(prompts[p].token_ids().ids().begin(), prompts[p].token_ids().ids().end());
            }
            g.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
            if (!job->parsed.max_tokens_given && job->chat())  // chat: up to the end of the context
              g.set_max_new_tokens(std::max<int32_t>(1, ctx - static_cast<int32_t>(ids.size()) + 1));
            for (int i = 0; i < job->parsed.n; ++i) {
              auto c = std::make_unique<Choice>();
              c->index = static_cast<int>(job->choices.size());
              c->request = g;
              c->request.set_seed(job->parsed.seed_given ? job->parsed.options.seed() + i : seeds());
              c->prompt_tokens = static_cast<int>(ids.size());
              c->count_prompt = i == 0;
              if (reasoning) c->reasoning = std::make_unique<ReasoningStream>(opens_reasoning);
              if (job->parsed.parse_tool_calls) {
                c->tools = std::make_unique<ToolCallStream>();
                c->call_id = absl::StrCat(job->id.substr(job->id.find('-') + 1), "_", c->index);
              }
              // Checked now, so that a bad request gets its 400 before a stream starts.
              absl::StatusOr<ValidatedRequest> v = ValidateGenerateRequest(c->request, tok, limits, request_limits);
              if (!v.ok()) return bad_request(p, v.status());
              job->choices.push_back(std::move(c));
            }
          }
          // Only the choices' requests (token ids) are needed from here on.
          prompts.clear();
          turn.End();

          if (!job->parsed.stream) {
            std::vector<std::thread> threads;
            for (size_t i = 1; i < job->choices.size(); ++i) {
              Choice* c = job->choices[i].get();
              threads.emplace_back([this, job, c] {
                CollectSink sink(*job, *c);
                c->status = service_.Run(c->request, sink, absl::InfiniteFuture());
              });
            }
            {
              Choice* c = job->choices[0].get();
              CollectSink sink(*job, *c);
              c->status = service_.Run(c->request, sink, absl::InfiniteFuture());
            }
            for (std::thread& t : threads) t.join();
            for (const auto& c : job->choices)
              if (!c->status.ok()) return SendError(res, c->status);
            res.set_content(job->Response().dump(-1, ' ', false, Json::error_handler_t::replace), kJson);
            return;
          }

          // Streaming: the choices run on their own threads; the response starts with the first
          // event, or is an error if every choice failed before one.
          auto stream = std::make_shared<Stream>();
          stream->running = static_cast<int>(job->choices.size());
          for (const auto& owned : job->choices) {
            Choice* c = owned.get();
            stream->threads.emplace_back([this, job, stream, c] {
              StreamSink sink(*job, *c, *stream);
              const absl::Status st = service_.Run(c->request, sink, absl::InfiniteFuture());
              std::lock_guard<std::mutex> lock(stream->mu);
              if (!st.ok()) {
                if (stream->first_error.ok()) stream->first_error = st;
                if (stream->any_event) {
                  const openai::HttpError e = openai::ErrorFromStatus(st);
                  stream->events.push_back(e.body);
                }
              }
              --stream->running;
              stream->cv.notify_all();
            });
          }
          {
            std::unique_lock<std::mutex> lock(stream->mu);
            stream->cv.wait(lock, [&] { return stream->any_event || stream->running == 0; });
            if (!stream->any_event && !stream->first_error.ok()) {
              const absl::Status st = stream->first_error;
              lock.unlock();
              stream->JoinAll();
              return SendError(res, st);
            }
          }
          res.set_header("Cache-Control", "no-cache");
          res.set_chunked_content_provider(
              "text/event-stream",
              [job, stream](size_t, httplib::DataSink& sink) {
                std::unique_lock<std::mutex> lock(stream->mu);
                for (;;) {
                  stream->cv.wait(lock, [&] { return !stream->events.empty() || stream->running == 0; });
                  while (!stream->events.empty()) {
                    std::string e = absl::StrCat("data: ", stream->events.front(), "\n\n");
                    stream->events.pop_front();
                    lock.unlock();
                    const bool ok = sink.write(e.data(), e.size());
                    lock.lock();
                    if (!ok) {
                      stream->client_gone.store(true);
                      return false;
                    }
                  }
                  if (stream->running == 0 && stream->events.empty()) break;
                }
                lock.unlock();
                std::string tail;
                if (job->parsed.include_usage && stream->first_error.ok()) {
                  Json e = job->ChunkEnvelope();
                  e["choices"] = Json::array();
                  e["usage"] = job->Usage();
                  tail = absl::StrCat("data: ", e.dump(), "\n\n");
                }
                tail += "data: [DONE]\n\n";
                sink.write(tail.data(), tail.size());
                sink.done();
                return true;
              },
              [stream](bool) {
                stream->client_gone.store(true);
                stream->JoinAll();
              });
        };
  };
  s.Post("/v1/completions", generate(openai::Endpoint::kCompletions));
  s.Post("/v1/chat/completions", generate(openai::Endpoint::kChatCompletions));
}

}  // namespace mer::gateway
