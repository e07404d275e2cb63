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

prometheus::Histogram::BucketBoundaries Exponential(double start, double factor, int n) {
  prometheus::Histogram::BucketBoundaries b;
  for (int i = 0; i < n; ++i, start *= factor) b.push_back(start);
  return b;
}

}  // namespace

struct ComputeMetrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<CapacityCollectable> capacity = std::make_shared<CapacityCollectable>();
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

std::vector<std::shared_ptr<prometheus::Collectable>> ComputeMetrics::collectables() const {
  return {impl_->registry, impl_->capacity};
}

}  // namespace mer::compute
