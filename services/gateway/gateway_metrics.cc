#include "services/gateway/gateway_metrics.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/buckets.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "proto/grpc_status.h"
#include "services/gateway/metrics_merge.h"

namespace mer::gateway {
// The per-request series of one model_name.
struct ModelSeries {
  std::string model_name;
  prometheus::Histogram* queue;
  prometheus::Histogram* ttft;
  prometheus::Histogram* itl;
  prometheus::Histogram* duration;
  prometheus::Counter* prompt_tokens;
  prometheus::Counter* generated_tokens;
  std::map<std::string, prometheus::Counter*> finished;  // by finish_reason; guarded by Impl::mu
};

struct GatewayMetrics::Impl : prometheus::Collectable {
  GatewayMetricsOptions options;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>* requests;
  prometheus::Family<prometheus::Histogram>* queue_family;
  prometheus::Family<prometheus::Histogram>* ttft_family;
  prometheus::Family<prometheus::Histogram>* itl_family;
  prometheus::Family<prometheus::Histogram>* duration_family;
  prometheus::Family<prometheus::Counter>* prompt_family;
  prometheus::Family<prometheus::Counter>* generated_family;
  prometheus::Family<prometheus::Counter>* finished_family;
  mutable std::mutex mu;
  std::map<grpc::StatusCode, prometheus::Counter*> by_code;    // guarded by mu
  std::function<std::pair<int, int>()> load;                   // guarded by mu
  std::function<double()> kv_usage;                            // guarded by mu
  std::map<std::string, std::unique_ptr<ModelSeries>> models;  // guarded by mu; never removed
  std::atomic<ModelSeries*> series{nullptr};                   // the current model's (set before any request)
  prometheus::Gauge* running;
  prometheus::Gauge* waiting;
  prometheus::Gauge* kv_usage_ratio;
  prometheus::Gauge* compute_up;

  // The series of `name`, made on first use. Requires mu.
  ModelSeries* SeriesFor(const std::string& name) {
    std::unique_ptr<ModelSeries>& s = models[name];
    if (s == nullptr) {
      const prometheus::Labels labels{{"model_name", name}};
      const auto latency = ExponentialBuckets(0.001, 2, 16);  // 1 ms .. 33 s
      s = std::make_unique<ModelSeries>();
      s->model_name = name;
      s->queue = &queue_family->Add(labels, latency);
      s->ttft = &ttft_family->Add(labels, latency);
      s->itl = &itl_family->Add(labels, ExponentialBuckets(0.0001, 2, 16));
      s->duration = &duration_family->Add(labels, latency);
      s->prompt_tokens = &prompt_family->Add(labels);
      s->generated_tokens = &generated_family->Add(labels);
    }
    return s.get();
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<std::pair<int, int>()> f;
    std::function<double()> kv;
    {
      std::lock_guard<std::mutex> lock(mu);
      f = load;
      kv = kv_usage;
    }
    if (f) {
      const auto [r, w] = f();
      running->Set(r);
      waiting->Set(w);
    }
    if (kv) kv_usage_ratio->Set(kv());
    std::vector<prometheus::MetricFamily> out = registry->Collect();
    AddLabel(&out, "daemon", "gateway");
    prometheus::MetricFamily up;
    up.name = "mer_scrape_up";
    up.help = "Whether the gateway's scrape of the daemon's /metrics worked at this scrape (1) or not (0).";
    up.type = prometheus::MetricType::Gauge;
    // `rank`: the expert-parallel rank whose mer-residency the page is (empty: no rank label).
    auto scrape = [&](const std::string& url, const std::string& daemon, const std::string& rank) {
      if (url.empty()) return;
      bool ok = false;
      if (auto body = HttpGet(url, options.scrape_timeout); body.ok()) {
        if (auto families = ParseMetricsText(*body); families.ok()) {
          // The other exposer's own families (exposer_scrapes_total, ...) would clash with
          // the ones this page's exposer adds after the collectables; they describe only HTTP.
          std::erase_if(*families, [](const prometheus::MetricFamily& f) { return f.name.rfind("exposer_", 0) == 0; });
          if (!rank.empty()) AddLabel(&*families, "rank", rank);
          AddLabel(&*families, "daemon", daemon);  // first: each is put before the labels there
          MergeFamilies(&out, std::move(*families));
          ok = true;
        }
      }
      prometheus::ClientMetric m;
      m.label.push_back({"daemon", daemon});
      if (!rank.empty()) m.label.push_back({"rank", rank});
      m.gauge.value = ok ? 1 : 0;
      up.metric.push_back(std::move(m));
    };
    scrape(options.compute_metrics_url, "compute", "");
    const std::vector<std::string>& residencies = options.residency_metrics_urls;
    for (size_t r = 0; r < residencies.size(); ++r)
      scrape(residencies[r], "residency", residencies.size() > 1 ? absl::StrCat(r) : "");
    if (!up.metric.empty()) out.push_back(std::move(up));
    return out;
  }
};

GatewayMetrics::GatewayMetrics(const GatewayMetricsOptions& options) : impl_(std::make_shared<Impl>()) {
  Impl& i = *impl_;
  i.options = options;
  auto& r = *i.registry;
  i.requests = &prometheus::BuildCounter()
                    .Name("mer_requests_total")
                    .Help("Generate calls that ended, by gRPC status code.")
                    .Register(r);
  for (grpc::StatusCode c :
       {grpc::StatusCode::OK, grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::RESOURCE_EXHAUSTED,
        grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::CANCELLED, grpc::StatusCode::UNAVAILABLE})
    i.by_code[c] = &i.requests->Add({{"status", GrpcCodeName(c)}});
  i.running = &prometheus::BuildGauge()
                   .Name("mer_requests_running")
                   .Help("Generate calls admitted and generating.")
                   .Register(r)
                   .Add({});
  i.waiting = &prometheus::BuildGauge()
                   .Name("mer_requests_waiting")
                   .Help("Generate calls waiting in the queue.")
                   .Register(r)
                   .Add({});
  i.kv_usage_ratio = &prometheus::BuildGauge()
                          .Name("mer_kv_cache_usage_ratio")
                          .Help("Fraction of the KV budget reserved by running requests (0..1).")
                          .Register(r)
                          .Add({});
  i.compute_up = &prometheus::BuildGauge()
                      .Name("mer_compute_up")
                      .Help("Whether mer-compute answers (1) or not (0).")
                      .Register(r)
                      .Add({});
  i.queue_family = &prometheus::BuildHistogram()
                        .Name("mer_request_queue_seconds")
                        .Help("Time a Generate call waited for admission.")
                        .Register(r);
  i.ttft_family = &prometheus::BuildHistogram()
                       .Name("mer_time_to_first_token_seconds")
                       .Help("Generate call start to its first generated token.")
                       .Register(r);
  i.itl_family = &prometheus::BuildHistogram()
                      .Name("mer_inter_token_latency_seconds")
                      .Help("Time between consecutive generated tokens of a call.")
                      .Register(r);
  i.duration_family = &prometheus::BuildHistogram()
                           .Name("mer_request_duration_seconds")
                           .Help("Generate call start to its end.")
                           .Register(r);
  i.prompt_family = &prometheus::BuildCounter()
                         .Name("mer_prompt_tokens_total")
                         .Help("Prompt tokens of admitted Generate calls.")
                         .Register(r);
  i.generated_family =
      &prometheus::BuildCounter().Name("mer_generated_tokens_total").Help("Tokens streamed to clients.").Register(r);
  i.finished_family = &prometheus::BuildCounter()
                           .Name("mer_request_success_total")
                           .Help("Generate calls that ended with a final message, by finish reason.")
                           .Register(r);
  {
    std::lock_guard<std::mutex> lock(i.mu);
    i.series.store(i.SeriesFor(options.model_name));
  }
  prometheus::BuildGauge()
      .Name("mer_build_info")
      .Help("Build of the daemon; always 1.")
      .Register(r)
      .Add({{"daemon", "gateway"}, {"version", options.version}})
      .Set(1);
}

GatewayMetrics::~GatewayMetrics() = default;

void GatewayMetrics::OnRequestEnd(grpc::StatusCode code) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->by_code.find(code);
  if (it == impl_->by_code.end())
    it = impl_->by_code.emplace(code, &impl_->requests->Add({{"status", GrpcCodeName(code)}})).first;
  it->second->Increment();
}
void GatewayMetrics::SetLoadCallback(std::function<std::pair<int, int>()> load) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->load = std::move(load);
}
void GatewayMetrics::SetKvUsageCallback(std::function<double()> usage) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->kv_usage = std::move(usage);
}
void GatewayMetrics::SetModelName(const std::string& name) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->series.store(impl_->SeriesFor(name));
}
void GatewayMetrics::OnFinish(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ModelSeries* s = impl_->series.load();
  prometheus::Counter*& c = s->finished[finish_reason];
  if (c == nullptr) c = &impl_->finished_family->Add({{"model_name", s->model_name}, {"finish_reason", finish_reason}});
  c->Increment();
}
void GatewayMetrics::SetComputeUp(bool up) { impl_->compute_up->Set(up ? 1 : 0); }
void GatewayMetrics::ObserveQueue(double s) { impl_->series.load()->queue->Observe(s); }
void GatewayMetrics::ObserveTtft(double s) { impl_->series.load()->ttft->Observe(s); }
void GatewayMetrics::ObserveInterToken(double s) { impl_->series.load()->itl->Observe(s); }
void GatewayMetrics::ObserveDuration(double s) { impl_->series.load()->duration->Observe(s); }
void GatewayMetrics::AddPromptTokens(int n) { impl_->series.load()->prompt_tokens->Increment(n); }
void GatewayMetrics::AddGeneratedTokens(int n) { impl_->series.load()->generated_tokens->Increment(n); }

std::vector<std::shared_ptr<prometheus::Collectable>> GatewayMetrics::collectables() const { return {impl_}; }

}  // namespace mer::gateway
