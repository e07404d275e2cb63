#include "services/compute/daemon/compute_metrics.h"

#include <mutex>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace mer::compute {
namespace {

class CapacityCollectable : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::function<Capacity()> f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      f = capacity_;
    }
    if (!f) return {};
    const Capacity c = f();
    auto gauge = [](std::string name, std::string help) {
      prometheus::MetricFamily m;
      m.name = std::move(name);
      m.help = std::move(help);
      m.type = prometheus::MetricType::Gauge;
      return m;
    };
    auto add = [](prometheus::MetricFamily* m, double v, std::string state) {
      prometheus::ClientMetric cm;
      cm.label.push_back({"state", std::move(state)});
      cm.gauge.value = v;
      m->metric.push_back(std::move(cm));
    };
    std::vector<prometheus::MetricFamily> out;
    out.push_back(gauge("mer_sequence_slots", "KV cache sequence slots by state."));
    add(&out.back(), c.free_sequences, "free");
    add(&out.back(), c.max_sequences - c.free_sequences, "used");
    out.push_back(gauge("mer_kv_budget_tokens", "KV positions of the budget, reserved by running sequences or free."));
    add(&out.back(), double(c.kv_free_tokens), "free");
    add(&out.back(), double(c.kv_budget_tokens - c.kv_free_tokens), "reserved");
    return out;
  }
  void set(std::function<Capacity()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = std::move(f);
  }

 private:
  mutable std::mutex mu_;
  std::function<Capacity()> capacity_;
};

// One more sample of a gauge family.
void AddSample(prometheus::MetricFamily* m, double v, std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric cm;
  cm.label = std::move(labels);
  cm.gauge.value = v;
  m->metric.push_back(std::move(cm));
}

// The backend counters of the last step (BackendCounters), as the VRAM tier's families.
class BackendCollectable : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    BackendCounters b;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!valid_) return {};
      b = last_;
    }
    std::vector<prometheus::MetricFamily> out;
    auto family = [&out](std::string name, std::string help, prometheus::MetricType type, double v,
                         std::vector<prometheus::ClientMetric::Label> labels) {
      prometheus::MetricFamily m;
      m.name = std::move(name);
      m.help = std::move(help);
      m.type = type;
      prometheus::ClientMetric cm;
      cm.label = std::move(labels);
      if (type == prometheus::MetricType::Counter) cm.counter.value = v;
      else cm.gauge.value = v;
      m.metric.push_back(std::move(cm));
      out.push_back(std::move(m));
    };
    const auto counter = prometheus::MetricType::Counter;
    const auto gauge = prometheus::MetricType::Gauge;
    const std::vector<prometheus::ClientMetric::Label> vram = {{"tier", "vram"}};
    family("mer_expert_lookups_total", "Distinct experts the steps needed, summed over layers, by tier.", counter,
           double(b.expert_lookups), vram);
    family("mer_expert_misses_total", "Needed experts that were not in the tier and were uploaded.", counter,
           double(b.expert_misses), vram);
    family("mer_evictions_total", "Experts evicted from the tier to make room.", counter, double(b.evictions), vram);
    family("mer_prefetch_issued_total", "Experts uploaded into the tier ahead of demand (look-ahead).", counter,
           double(b.vram_prefetch_issued), vram);
    family("mer_prefetch_useful_total", "Prefetched experts that the predicted layer used.", counter,
           double(b.vram_prefetch_useful), vram);
    family("mer_prefetch_wasted_total", "Prefetched experts that the predicted layer did not use.", counter,
           double(b.vram_prefetch_wasted), vram);
    family("mer_expert_upload_bytes_total", "Expert bytes copied host -> VRAM.", counter, double(b.upload_bytes), {});
    family("mer_host_syncs_total", "Host waits on the GPU inside forward steps.", counter, double(b.host_syncs), {});
    family("mer_graph_launches_total", "Forward steps replayed as a CUDA graph.", counter, double(b.graph_launches),
           {});
    family("mer_backend_tokens_total", "Batch tokens the backend processed.", counter, double(b.tokens), {});
    family("mer_tier_slots", "Expert slots of the tier by state.", gauge, double(b.arena_resident),
           {{"state", "resident"}, {"tier", "vram"}});
    AddSample(&out.back(), double(b.arena_slots - b.arena_resident), {{"state", "free"}, {"tier", "vram"}});
    family("mer_vram_bytes", "Device memory: the expert arena, and the peak in use device-wide.", gauge,
           double(b.arena_bytes), {{"use", "arena"}});
    AddSample(&out.back(), double(b.vram_used_peak_bytes), {{"use", "peak"}});
    return out;
  }
  void set_reader(std::function<BackendCounters()> read) {
    std::lock_guard<std::mutex> lock(mu_);
    read_ = std::move(read);
  }
  // On the step thread.
  void Sample() {
    std::function<BackendCounters()> read;
    {
      std::lock_guard<std::mutex> lock(mu_);
      read = read_;
    }
    if (!read) return;
    const BackendCounters b = read();
    std::lock_guard<std::mutex> lock(mu_);
    last_ = b;
    valid_ = true;
  }

 private:
  mutable std::mutex mu_;
  std::function<BackendCounters()> read_;
  BackendCounters last_;
  bool valid_ = false;
};

prometheus::Histogram::BucketBoundaries Exponential(double start, double factor, int n) {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i < n; ++i, start *= factor) b.push_back(start);
  return b;
}

}  // namespace

struct ComputeMetrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<CapacityCollectable> capacity = std::make_shared<CapacityCollectable>();
  std::shared_ptr<BackendCollectable> backend = std::make_shared<BackendCollectable>();
  prometheus::Histogram* step_seconds;
  prometheus::Histogram* batch_size;
  prometheus::Counter* prompt_tokens;
  prometheus::Counter* generated_tokens;
  prometheus::Counter* steps;
  prometheus::Counter* seq_ok;
  prometheus::Counter* seq_cancelled;
  prometheus::Counter* seq_failed;
};

ComputeMetrics::ComputeMetrics(const std::string& version, const std::string& backend,
                               std::function<Capacity()> capacity)
    : impl_(std::make_unique<Impl>()) {
  auto& r = *impl_->registry;
  impl_->step_seconds = &prometheus::BuildHistogram()
                             .Name("mer_step_seconds")
                             .Help("Duration of one batched forward step, sampling included.")
                             .Register(r)
                             .Add({}, Exponential(0.0005, 2, 14));
  impl_->batch_size = &prometheus::BuildHistogram()
                           .Name("mer_batch_size")
                           .Help("Tokens in one step's batch (decodes and prompt chunks).")
                           .Register(r)
                           .Add({}, Exponential(1, 2, 11));
  impl_->prompt_tokens = &prometheus::BuildCounter()
                              .Name("mer_prompt_tokens_total")
                              .Help("Prompt tokens prefilled.")
                              .Register(r)
                              .Add({});
  impl_->generated_tokens = &prometheus::BuildCounter()
                                 .Name("mer_generated_tokens_total")
                                 .Help("Tokens sampled.")
                                 .Register(r)
                                 .Add({});
  impl_->steps = &prometheus::BuildCounter()
                      .Name("mer_steps_total")
                      .Help("Batched forward steps run.")
                      .Register(r)
                      .Add({});
  auto& seqs = prometheus::BuildCounter()
                   .Name("mer_sequences_total")
                   .Help("Sequences that left the batch, by result (ok, cancelled, error).")
                   .Register(r);
  impl_->seq_ok = &seqs.Add({{"result", "ok"}});
  impl_->seq_cancelled = &seqs.Add({{"result", "cancelled"}});
  impl_->seq_failed = &seqs.Add({{"result", "error"}});
  prometheus::BuildGauge()
      .Name("mer_build_info")
      .Help("Build of the daemon; always 1.")
      .Register(r)
      .Add({{"daemon", "compute"}, {"version", version}, {"backend", backend}})
      .Set(1);
  impl_->capacity->set(std::move(capacity));
}

ComputeMetrics::~ComputeMetrics() = default;

void ComputeMetrics::OnStep(double seconds, int batch_tokens, int sequences, int prompt_tokens,
                            int generated) {
  impl_->step_seconds->Observe(seconds);
  impl_->batch_size->Observe(batch_tokens);
  impl_->prompt_tokens->Increment(prompt_tokens);
  impl_->generated_tokens->Increment(generated);
  impl_->steps->Increment();
  impl_->backend->Sample();
}

void ComputeMetrics::OnSequenceEnd(const absl::Status& status, int generated) {
  if (status.ok()) {
    impl_->seq_ok->Increment();
  } else if (status.code() == absl::StatusCode::kCancelled) {
    impl_->seq_cancelled->Increment();
  } else {
    impl_->seq_failed->Increment();
  }
}

void ComputeMetrics::set_capacity(std::function<Capacity()> capacity) {
  impl_->capacity->set(std::move(capacity));
}

void ComputeMetrics::set_backend_counters(std::function<BackendCounters()> read) {
  impl_->backend->set_reader(std::move(read));
}

std::vector<std::shared_ptr<prometheus::Collectable>> ComputeMetrics::collectables() const {
  return {impl_->registry, impl_->capacity, impl_->backend};
}

}  // namespace mer::compute
