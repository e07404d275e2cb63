#include "services/compute/daemon/compute_metrics.h"

#include <mutex>
#include <vector>

#include "common/metrics/buckets.h"
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
  // The cuda backend's step-level series (null for cpu; rank 0's with ranks: every rank runs every
  // step), and the sample they were last advanced to.
  prometheus::Counter* host_syncs = nullptr;
  prometheus::Counter* graph_launches = nullptr;
  prometheus::Counter* backend_tokens = nullptr;
  BackendCounters last;
  // A device's series: the engine's, or each cuda rank's, labelled by its rank and GPU.
  struct DeviceSeries {
    prometheus::Counter* lookups;
    prometheus::Counter* misses;
    prometheus::Counter* upload_bytes;
    prometheus::Counter* evictions;
    prometheus::Counter* prefetch[3];  // issued, useful, wasted
    prometheus::Gauge* slots[2];       // resident, free; null once dropped (arena_placed_by_residency)
    prometheus::Gauge* vram_bytes[6];  // dense, kv, workspace, arena, used, peak
    BackendCounters last;
  };
  std::vector<DeviceSeries> devices;
  prometheus::Family<prometheus::Gauge>* tier_slots = nullptr;
  void AddDeviceFamilies(const std::vector<BackendCounters>& by_device, bool ranks);
  // Expert pairs computed: one series for a single engine, or one per expert-parallel rank
  // (labelled rank="r", with the rank's exchange time beside it), made at the first sample.
  prometheus::Family<prometheus::Counter>* pairs_family = nullptr;
  std::vector<prometheus::Counter*> pairs;
  std::vector<prometheus::Counter*> exchange_seconds;
  prometheus::Counter* busiest_rank_pairs = nullptr;  // with ranks
  prometheus::Gauge* replicas = nullptr;              // with ranks
  std::vector<BackendCounters> last_ranks;
};

ComputeMetrics::ComputeMetrics(const std::string& version, const std::string& backend,
                               std::function<Capacity()> capacity)
    : impl_(std::make_unique<Impl>()) {
  auto& r = *impl_->registry;
  impl_->step_seconds = &prometheus::BuildHistogram()
                             .Name("mer_step_seconds")
                             .Help("Duration of one batched forward step, sampling included.")
                             .Register(r)
                             .Add({}, ExponentialBuckets(0.0005, 2, 14));
  impl_->batch_size = &prometheus::BuildHistogram()
                           .Name("mer_batch_size")
                           .Help("Tokens in one step's batch (decodes and prompt chunks).")
                           .Register(r)
                           .Add({}, ExponentialBuckets(1, 2, 11));
  impl_->prompt_tokens =
      &prometheus::BuildCounter().Name("mer_prompt_tokens_total").Help("Prompt tokens prefilled.").Register(r).Add({});
  impl_->generated_tokens =
      &prometheus::BuildCounter().Name("mer_generated_tokens_total").Help("Tokens sampled.").Register(r).Add({});
  impl_->steps =
      &prometheus::BuildCounter().Name("mer_steps_total").Help("Batched forward steps run.").Register(r).Add({});
  auto& seqs = prometheus::BuildCounter()
                   .Name("mer_sequences_total")
                   .Help("Sequences that left the batch, by result (ok, cancelled, error).")
                   .Register(r);
  impl_->seq_ok = &seqs.Add({{"result", "ok"}});
  impl_->seq_cancelled = &seqs.Add({{"result", "cancelled"}});
  impl_->seq_failed = &seqs.Add({{"result", "error"}});
  impl_->pairs_family = &prometheus::BuildCounter()
                             .Name("mer_expert_pairs_total")
                             .Help("(token, expert) pairs whose expert FFN was computed, by expert-parallel rank.")
                             .Register(r);
  prometheus::BuildGauge()
      .Name("mer_build_info")
      .Help("Build of the daemon; always 1.")
      .Register(r)
      .Add({{"daemon", "compute"}, {"version", version}, {"backend", backend}})
      .Set(1);
  impl_->capacity->set(std::move(capacity));
}

// The device backend's families (expert lookups in VRAM, uploads, host syncs, VRAM by use),
// registered when its first counters arrive: the per-device ones with a series for each device
// in `by_device`, labelled gpu and rank when they are expert-parallel ranks.
void ComputeMetrics::Impl::AddDeviceFamilies(const std::vector<BackendCounters>& by_device, bool ranks) {
  auto& r = *registry;
  auto counter = [&r](const char* name, const char* help) -> prometheus::Family<prometheus::Counter>& {
    return prometheus::BuildCounter().Name(name).Help(help).Register(r);
  };
  host_syncs = &counter("mer_host_syncs_total", "Host synchronisations with the GPU inside forward passes.").Add({});
  graph_launches = &counter("mer_graph_launches_total", "Forward steps replayed as a CUDA graph.").Add({});
  backend_tokens = &counter("mer_backend_tokens_total", "Batch tokens the backend processed.").Add({});
  auto& lookups = counter("mer_expert_lookups_total", "Distinct (layer, expert) a batch needed, summed over layers.");
  auto& misses = counter("mer_expert_misses_total", "Expert lookups not in the VRAM arena (uploaded from the host).");
  auto& upload_bytes = counter("mer_expert_upload_bytes_total", "Bytes of expert uploads host -> VRAM.");
  auto& evictions = counter("mer_evictions_total", "VRAM arena slots reused for another expert.");
  const char* prefetch_families[3][2] = {
      {"mer_prefetch_issued_total", "Experts uploaded into the tier ahead of demand (look-ahead)."},
      {"mer_prefetch_useful_total", "Prefetched experts that the predicted layer used."},
      {"mer_prefetch_wasted_total", "Prefetched experts that the predicted layer did not use."}};
  prometheus::Family<prometheus::Counter>* prefetch_family[3];
  for (int i = 0; i < 3; ++i) prefetch_family[i] = &counter(prefetch_families[i][0], prefetch_families[i][1]);
  auto& vram = prometheus::BuildGauge()
                   .Name("mer_vram_bytes")
                   .Help(
                       "Device memory by use: dense weights, KV cache, workspaces, expert arena; "
                       "used: device-wide at the last sample.")
                   .Register(r);
  tier_slots = &prometheus::BuildGauge().Name("mer_tier_slots").Help("Expert slots of the tier by state.").Register(r);
  const char* uses[6] = {"dense", "kv", "workspace", "arena", "used", "peak"};
  for (size_t d = 0; d < by_device.size(); ++d) {
    prometheus::Labels device;
    if (ranks) device = {{"gpu", std::to_string(by_device[d].gpu)}, {"rank", std::to_string(d)}};
    const auto with = [&device](prometheus::Labels more) {
      more.insert(device.begin(), device.end());
      return more;
    };
    DeviceSeries& ds = devices.emplace_back();
    ds.lookups = &lookups.Add(with({{"tier", "vram"}}));
    ds.misses = &misses.Add(with({{"tier", "vram"}}));
    ds.upload_bytes = &upload_bytes.Add(with({}));
    ds.evictions = &evictions.Add(with({{"tier", "vram"}}));
    for (int i = 0; i < 3; ++i) ds.prefetch[i] = &prefetch_family[i]->Add(with({{"tier", "vram"}}));
    ds.slots[0] = &tier_slots->Add(with({{"state", "resident"}, {"tier", "vram"}}));
    ds.slots[1] = &tier_slots->Add(with({{"state", "free"}, {"tier", "vram"}}));
    for (int i = 0; i < 6; ++i) ds.vram_bytes[i] = &vram.Add(with({{"use", uses[i]}}));
  }
}

ComputeMetrics::~ComputeMetrics() = default;

void ComputeMetrics::OnBackendCounters(const BackendCounters& s, const std::vector<BackendCounters>& ranks) {
  Impl& m = *impl_;
  const auto advance = [](prometheus::Counter* c, int64_t now, int64_t before) {
    if (now > before) c->Increment(static_cast<double>(now - before));
  };
  // One engine's pairs as the rank-less series; each rank's as its own.
  const std::vector<BackendCounters> one = {s};
  const std::vector<BackendCounters>& by_rank = ranks.empty() ? one : ranks;
  if (m.pairs.empty()) {  // the first sample: one series, or the ranks' families
    m.last_ranks.assign(by_rank.size(), BackendCounters{});
    if (ranks.empty()) {
      m.pairs.push_back(&m.pairs_family->Add({}));
    } else {
      auto& exchange = prometheus::BuildCounter()
                           .Name("mer_expert_exchange_seconds_total")
                           .Help("Wall time of an expert-parallel rank in its layers' exchanges of expert outputs.")
                           .Register(*m.registry);
      for (size_t r = 0; r < ranks.size(); ++r) {
        const prometheus::Labels labels = {{"rank", std::to_string(r)}};
        m.pairs.push_back(&m.pairs_family->Add(labels));
        m.exchange_seconds.push_back(&exchange.Add(labels));
      }
      m.busiest_rank_pairs =
          &prometheus::BuildCounter()
               .Name("mer_expert_busiest_rank_pairs_total")
               .Help("Over layers and steps, the pairs of the expert-parallel rank with the most in the layer.")
               .Register(*m.registry)
               .Add({});
      m.replicas = &prometheus::BuildGauge()
                        .Name("mer_expert_replicas")
                        .Help("(layer, expert) held by every expert-parallel rank, at the last sample.")
                        .Register(*m.registry)
                        .Add({});
    }
  }
  if (m.replicas != nullptr) m.replicas->Set(static_cast<double>(s.replicated_experts));
  // Every rank counts the busiest rank's pairs alike: rank 0's (before its sample is kept below).
  if (m.busiest_rank_pairs != nullptr)
    advance(m.busiest_rank_pairs, by_rank[0].busiest_rank_pairs, m.last_ranks[0].busiest_rank_pairs);
  for (size_t r = 0; r < by_rank.size() && r < m.pairs.size(); ++r) {
    advance(m.pairs[r], by_rank[r].expert_pairs, m.last_ranks[r].expert_pairs);
    if (r < m.exchange_seconds.size() && by_rank[r].exchange_seconds_x1e6 > m.last_ranks[r].exchange_seconds_x1e6)
      m.exchange_seconds[r]->Increment(
          double(by_rank[r].exchange_seconds_x1e6 - m.last_ranks[r].exchange_seconds_x1e6) / 1e6);
    m.last_ranks[r] = by_rank[r];
  }
  if (!s.device) return;
  if (m.devices.empty()) m.AddDeviceFamilies(by_rank, !ranks.empty());
  advance(m.host_syncs, s.host_syncs, m.last.host_syncs);
  advance(m.graph_launches, s.graph_launches, m.last.graph_launches);
  advance(m.backend_tokens, s.tokens, m.last.tokens);
  m.last = s;
  for (size_t d = 0; d < by_rank.size() && d < m.devices.size(); ++d) {
    Impl::DeviceSeries& ds = m.devices[d];
    const BackendCounters& c = by_rank[d];
    advance(ds.lookups, c.expert_lookups, ds.last.expert_lookups);
    advance(ds.misses, c.expert_misses, ds.last.expert_misses);
    advance(ds.upload_bytes, c.expert_upload_bytes, ds.last.expert_upload_bytes);
    advance(ds.evictions, c.evictions, ds.last.evictions);
    advance(ds.prefetch[0], c.vram_prefetch_issued, ds.last.vram_prefetch_issued);
    advance(ds.prefetch[1], c.vram_prefetch_useful, ds.last.vram_prefetch_useful);
    advance(ds.prefetch[2], c.vram_prefetch_wasted, ds.last.vram_prefetch_wasted);
    if (c.arena_placed_by_residency && ds.slots[0] != nullptr) {
      for (prometheus::Gauge*& g : ds.slots) {
        m.tier_slots->Remove(g);
        g = nullptr;
      }
    }
    if (ds.slots[0] != nullptr) {
      ds.slots[0]->Set(static_cast<double>(c.arena_resident));
      ds.slots[1]->Set(static_cast<double>(c.arena_slots - c.arena_resident));
    }
    const int64_t bytes[6] = {c.dense_bytes, c.kv_bytes,        c.workspace_bytes,
                              c.arena_bytes, c.vram_used_bytes, c.vram_used_peak_bytes};
    for (int i = 0; i < 6; ++i) ds.vram_bytes[i]->Set(static_cast<double>(bytes[i]));
    ds.last = c;
  }
}

void ComputeMetrics::OnStep(double seconds, int batch_tokens, int sequences, int prompt_tokens, int generated) {
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

void ComputeMetrics::set_capacity(std::function<Capacity()> capacity) { impl_->capacity->set(std::move(capacity)); }

std::vector<std::shared_ptr<prometheus::Collectable>> ComputeMetrics::collectables() const {
  return {impl_->registry, impl_->capacity};
}

}  // namespace mer::compute
