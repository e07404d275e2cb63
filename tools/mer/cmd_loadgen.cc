// `mer loadgen`: N concurrent Generate streams against mer-gateway, over gRPC or the HTTP API;
// throughput and latency percentiles, measured at the client.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "grpcpp/grpcpp.h"
#include "httplib.h"
#include "mer/v1/mer.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "proto/grpc_status.h"
#include "tools/mer/cli_util.h"

namespace mer::cli {
namespace {

constexpr char kLoadgenHelp[] =
    R"(usage: mer loadgen --addr HOST:PORT [--http http://HOST:PORT] [--concurrency N] [--requests M]
                   [--prompt-len L] [--prompt-bytes B] [--max-tokens T] [--temperature X] [--seed S]
                   [--timeout-ms MS] [--duration-seconds D] [--prompts K] [--record FILE | --expect FILE]

Runs M Generate calls (default 4 x N) on N concurrent streams (default 8), each call a fresh
prompt of L random token ids (default 31, seeded by --seed and the call's index) and T generated
tokens (default 128; end-of-sequence ignored, so every call generates exactly T). Greedy unless
--temperature. --prompt-bytes sends instead a text prompt of B bytes (random lowercase words,
seeded the same way), e.g. to load the gateway's admission of large prompts. Prints, measured at
this client:
  throughput   generated tokens / wall time, requests / wall time
  ttft         call start to the first token
  itl          gap between consecutive tokens of a call (a chunk of k tokens: its gap, then k-1 zeros)
  latency      call start to end
with p50, p90 and p99 of each, and each failure by status and cause (its message, digits as #).
A stream pauses 10 ms after a failed call. --duration-seconds stops issuing calls after D
seconds. --prompts K makes call i use the prompt of call i mod K (default: every call its own).
--record writes each successful call's ids (a line "PROMPT ID ID ..."); --expect reads such a
file and counts every successful call whose ids differ from its prompt's. Exits 1 if any call
failed, any failure had no message, any call ended more than 2 s past its deadline
(--timeout-ms), or any ids differed.
With --http the same calls go to the OpenAI-compatible HTTP API instead (streamed
/v1/completions with the same prompts, seeds and settings; --addr still answers GetModelInfo):
the tokens are the usage's, ttft and itl are measured per server-sent event, and there are no
ids to --record or --expect.
)";

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * (v.size() - 1) + 0.5));
  return v[i];
}

std::string Ms(std::vector<double>& v) {
  return absl::StrCat("p50 ", absl::StrFormat("%.2f", Percentile(v, 50) * 1e3), " ms, p90 ",
                      absl::StrFormat("%.2f", Percentile(v, 90) * 1e3), " ms, p99 ",
                      absl::StrFormat("%.2f", Percentile(v, 99) * 1e3), " ms");
}

// A failure's message as a cause to count by: digits as '#', at most 90 characters.
std::string Cause(const std::string& message) {
  std::string c = message.substr(0, 90);
  for (char& ch : c)
    if (ch >= '0' && ch <= '9') ch = '#';
  return c;
}

absl::StatusOr<std::map<int64_t, std::vector<int32_t>>> ReadIds(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::map<int64_t, std::vector<int32_t>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    int64_t index;
    if (!(fields >> index)) continue;
    std::vector<int32_t>& ids = out[index];
    for (int32_t id; fields >> id;) ids.push_back(id);
  }
  return out;
}

absl::Status WriteIds(const std::string& path, const std::map<int64_t, std::vector<int32_t>>& ids) {
  std::ofstream out(path);
  for (const auto& [index, v] : ids) out << index << (v.empty() ? "" : " ") << absl::StrJoin(v, " ") << "\n";
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// One streamed /v1/completions call of `req`'s prompt (text or token ids) and settings: the
// generated tokens (from the usage), the first event's delay and the gaps between later events.
absl::Status HttpGenerate(const std::string& url, const mer::v1::GenerateRequest& req, int64_t timeout_ms,
                          int64_t* tokens, std::vector<double>* ttft, std::vector<double>* gaps) {
  thread_local std::unique_ptr<httplib::Client> client;
  if (client == nullptr) {
    client = std::make_unique<httplib::Client>(url);
    client->set_read_timeout(std::chrono::milliseconds(timeout_ms));
    client->set_keep_alive(true);
    client->set_tcp_nodelay(true);
  }
  nlohmann::json prompt;
  if (req.has_text()) {
    prompt = req.text();
  } else {
    prompt = std::vector<int32_t>(req.token_ids().ids().begin(), req.token_ids().ids().end());
  }
  nlohmann::json body = {{"prompt", std::move(prompt)},
                         {"max_tokens", req.max_new_tokens()},
                         {"temperature", req.temperature()},
                         {"seed", req.seed()},
                         {"ignore_eos", true},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  const auto start = Clock::now();
  auto last = start;
  bool first = true;
  std::string buffer;
  int64_t usage = -1;
  httplib::Request r;
  r.method = "POST";
  r.path = "/v1/completions";
  r.body = body.dump();
  r.set_header("Content-Type", "application/json");
  r.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    buffer.append(data, size);
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos; buffer.erase(0, end + 2)) {
      const std::string event = buffer.substr(0, end);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      const nlohmann::json j = nlohmann::json::parse(event.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object()) usage = j["usage"].value("completion_tokens", int64_t{-1});
      if (!j.contains("choices") || j["choices"].empty()) continue;
      const auto now = Clock::now();
      const double gap = std::chrono::duration<double>(now - last).count();
      if (first)
        ttft->push_back(gap);
      else
        gaps->push_back(gap);
      first = false;
      last = now;
    }
    return true;
  };
  const httplib::Result res = client->send(r);
  if (!res) return absl::UnavailableError(absl::StrCat("HTTP: ", httplib::to_string(res.error())));
  if (res->status != 200) {
    // An error before the stream started: OpenAI's {"error": {"message": ...}}.
    // (The body went to content_receiver, into `buffer`.)
    const nlohmann::json j = nlohmann::json::parse(res->body.empty() ? buffer : res->body, nullptr, false);
    std::string message;
    if (j.is_object() && j.contains("error") && j["error"].is_object()) message = j["error"].value("message", "");
    absl::StatusCode code = absl::StatusCode::kUnknown;  // the gateway's mapping, read back
    switch (res->status) {
      case 400:
        code = absl::StatusCode::kInvalidArgument;
        break;
      case 404:
        code = absl::StatusCode::kNotFound;
        break;
      case 429:
        code = absl::StatusCode::kResourceExhausted;
        break;
      case 499:
        code = absl::StatusCode::kCancelled;
        break;
      case 503:
        code = absl::StatusCode::kUnavailable;
        break;
      case 504:
        code = absl::StatusCode::kDeadlineExceeded;
        break;
    }
    return absl::Status(code, absl::StrCat("HTTP ", res->status, ": ", message));
  }
  if (usage < 0) return absl::DataLossError("the stream had no usage");
  *tokens = usage;
  return absl::OkStatus();
}

}  // namespace

int RunLoadgen(const Args& args) {
  if (MaybeHelp(args, kLoadgenHelp)) return 0;
  auto parsed = Flags::Parse(args,
                             {"addr", "http", "concurrency", "requests", "prompt-len", "prompt-bytes", "max-tokens",
                              "temperature", "seed", "timeout-ms", "duration-seconds", "prompts", "record", "expect"},
                             {});
  if (!parsed.ok()) return Fail("loadgen", parsed.status());
  const Flags& f = *parsed;
  auto body = [&]() -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(const std::string addr, f.Required("addr"));
    const std::string http = f.String("http");
    if (!http.empty() && http.rfind("http://", 0) != 0)
      return absl::InvalidArgumentError("--http must be http://HOST:PORT");
    ASSIGN_OR_RETURN(const int64_t concurrency, f.Int("concurrency", 8));
    ASSIGN_OR_RETURN(const int64_t requests, f.Int("requests", 4 * concurrency));
    ASSIGN_OR_RETURN(const int64_t prompt_len, f.Int("prompt-len", 31));
    ASSIGN_OR_RETURN(const int64_t prompt_bytes, f.Int("prompt-bytes", 0));
    ASSIGN_OR_RETURN(const int64_t max_tokens, f.Int("max-tokens", 128));
    ASSIGN_OR_RETURN(const double temperature, f.Double("temperature", 0));
    ASSIGN_OR_RETURN(const int64_t seed, f.Int("seed", 1));
    ASSIGN_OR_RETURN(const int64_t timeout_ms, f.Int("timeout-ms", 600000));
    if (concurrency < 1 || concurrency > 4096) return absl::InvalidArgumentError("--concurrency must be in [1, 4096]");
    if (requests < 1) return absl::InvalidArgumentError("--requests must be >= 1");
    if (prompt_len < 1 || max_tokens < 1)
      return absl::InvalidArgumentError("--prompt-len and --max-tokens must be >= 1");
    if (prompt_bytes < 0 || prompt_bytes > (int64_t{1} << 30))
      return absl::InvalidArgumentError("--prompt-bytes must be in [0, 1 GiB]");
    ASSIGN_OR_RETURN(const double duration_s, f.Double("duration-seconds", 0));
    ASSIGN_OR_RETURN(const int64_t prompts, f.Int("prompts", requests));
    if (prompts < 1) return absl::InvalidArgumentError("--prompts must be >= 1");
    if (f.Has("record") && f.Has("expect")) return absl::InvalidArgumentError("give --record or --expect, not both");
    if (!http.empty() && (f.Has("record") || f.Has("expect")))
      return absl::InvalidArgumentError("--record and --expect compare token ids, which only the gRPC API returns");
    std::map<int64_t, std::vector<int32_t>> expected;
    if (f.Has("expect")) {
      ASSIGN_OR_RETURN(expected, ReadIds(f.String("expect")));
    }

    auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
    auto stub = mer::v1::Mer::NewStub(channel);
    mer::v1::ModelInfo info;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      const grpc::Status s = stub->GetModelInfo(&ctx, {}, &info);
      if (!s.ok())
        return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                            absl::StrCat("GetModelInfo: ", s.error_message()));
    }

    std::atomic<int64_t> next{0};
    std::mutex mu;
    std::vector<double> ttft, itl, latency;
    std::map<std::string, int> failures;
    std::map<int64_t, std::vector<int32_t>> recorded;
    int64_t tokens = 0, ok = 0, mismatched = 0, overdue = 0, silent = 0;
    const auto t0 = Clock::now();
    auto worker = [&] {
      std::vector<double> my_ttft, my_itl, my_latency;
      std::map<std::string, int> my_failures;
      std::map<int64_t, std::vector<int32_t>> my_recorded;
      int64_t my_tokens = 0, my_ok = 0, my_mismatched = 0, my_overdue = 0, my_silent = 0;
      for (int64_t i; (i = next.fetch_add(1)) < requests;) {
        if (duration_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > duration_s) break;
        const int64_t p = i % prompts;  // the call's prompt (and sampling seed)
        std::mt19937_64 rng(static_cast<uint64_t>(seed) * 1000003u + static_cast<uint64_t>(p));
        mer::v1::GenerateRequest req;
        if (prompt_bytes > 0) {
          std::string* text = req.mutable_text();
          text->reserve(static_cast<size_t>(prompt_bytes));
          while (static_cast<int64_t>(text->size()) < prompt_bytes) {
            const int64_t word = std::min<int64_t>(1 + static_cast<int64_t>(rng() % 9), prompt_bytes - text->size());
            for (int64_t k = 0; k + 1 < word; ++k) text->push_back(static_cast<char>('a' + rng() % 26));
            text->push_back(' ');
          }
        } else {
          for (int64_t k = 0; k < prompt_len; ++k)
            req.mutable_token_ids()->add_ids(static_cast<int32_t>(rng() % static_cast<uint64_t>(info.vocab_size())));
        }
        req.set_max_new_tokens(static_cast<int32_t>(max_tokens));
        req.set_temperature(static_cast<float>(temperature));
        req.set_seed(static_cast<uint64_t>(seed + p));
        req.set_ignore_eos(true);
        const auto start = Clock::now();
        if (!http.empty()) {
          int64_t n = 0;
          std::vector<double> gaps;
          const absl::Status s = HttpGenerate(http, req, timeout_ms, &n, &my_ttft, &gaps);
          const double took = std::chrono::duration<double>(Clock::now() - start).count();
          if (took > timeout_ms / 1e3 + 2) ++my_overdue;
          if (!s.ok()) {
            ++my_failures[absl::StrCat(absl::StatusCodeToString(s.code()), ": ", Cause(std::string(s.message())))];
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
          }
          ++my_ok;
          my_tokens += n;
          my_itl.insert(my_itl.end(), gaps.begin(), gaps.end());
          my_latency.push_back(std::chrono::duration<double>(Clock::now() - start).count());
          continue;
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
        auto last = start;
        int64_t n = 0;
        auto reader = stub->Generate(&ctx, req);
        mer::v1::GenerateResponse resp;
        std::vector<double> gaps;
        std::vector<int32_t> ids;
        while (reader->Read(&resp)) {
          if (!resp.has_chunk() || resp.chunk().token_ids_size() == 0) continue;
          ids.insert(ids.end(), resp.chunk().token_ids().begin(), resp.chunk().token_ids().end());
          const auto now = Clock::now();
          const double gap = std::chrono::duration<double>(now - last).count();
          if (n == 0) {
            my_ttft.push_back(gap);
          } else {
            gaps.push_back(gap);
          }
          for (int k = 1; k < resp.chunk().token_ids_size(); ++k) gaps.push_back(0);
          n += resp.chunk().token_ids_size();
          last = now;
        }
        const grpc::Status s = reader->Finish();
        const double took = std::chrono::duration<double>(Clock::now() - start).count();
        if (took > timeout_ms / 1e3 + 2) ++my_overdue;  // past its deadline: something hung
        if (!s.ok()) {
          if (s.error_message().empty()) ++my_silent;
          ++my_failures[absl::StrCat(GrpcCodeName(s.error_code()), ": ", Cause(s.error_message()))];
          // No hot loop against a server that is down.
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
          continue;
        }
        ++my_ok;
        if (f.Has("record")) my_recorded[p] = ids;
        if (auto it = expected.find(p); f.Has("expect") && (it == expected.end() || it->second != ids)) ++my_mismatched;
        my_tokens += n;
        my_itl.insert(my_itl.end(), gaps.begin(), gaps.end());
        my_latency.push_back(std::chrono::duration<double>(Clock::now() - start).count());
      }
      std::lock_guard<std::mutex> lock(mu);
      ttft.insert(ttft.end(), my_ttft.begin(), my_ttft.end());
      itl.insert(itl.end(), my_itl.begin(), my_itl.end());
      latency.insert(latency.end(), my_latency.begin(), my_latency.end());
      for (const auto& [k, v] : my_failures) failures[k] += v;
      recorded.merge(my_recorded);
      tokens += my_tokens;
      ok += my_ok;
      mismatched += my_mismatched;
      overdue += my_overdue;
      silent += my_silent;
    };
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < concurrency; ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();

    std::printf("loadgen: %s, %lld streams, %lld requests (%lld ok), prompt %lld + %lld generated tokens each, %s\n",
                http.empty() ? "gRPC" : "HTTP", static_cast<long long>(concurrency), static_cast<long long>(requests),
                static_cast<long long>(ok), static_cast<long long>(prompt_len), static_cast<long long>(max_tokens),
                temperature > 0 ? "sampled" : "greedy");
    std::printf("throughput: %.1f generated tokens/s, %.2f requests/s (%lld tokens in %.3f s)\n", tokens / wall,
                ok / wall, static_cast<long long>(tokens), wall);
    std::printf("ttft:       %s\n", Ms(ttft).c_str());
    std::printf("itl:        %s\n", Ms(itl).c_str());
    std::printf("latency:    %s\n", Ms(latency).c_str());
    for (const auto& [code, n] : failures) std::printf("failed:     %d %s\n", n, code.c_str());
    if (f.Has("expect"))
      std::printf("checked:    %lld ok calls against %s: %lld with other ids\n", static_cast<long long>(ok),
                  f.String("expect").c_str(), static_cast<long long>(mismatched));
    std::printf(
        "deadlines:  %lld calls ended more than 2 s past their deadline; %lld failures without a "
        "message\n",
        static_cast<long long>(overdue), static_cast<long long>(silent));
    if (f.Has("record")) RETURN_IF_ERROR(WriteIds(f.String("record"), recorded));
    return failures.empty() && mismatched == 0 && overdue == 0 && silent == 0 ? 0 : 1;
  };
  absl::StatusOr<int> rc = body();
  if (!rc.ok()) return Fail("loadgen", rc.status());
  return *rc;
}

}  // namespace mer::cli
