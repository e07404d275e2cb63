#include "services/residency/metrics/residency_metrics.h"

#include <limits>
#include <sstream>
#include <utility>

#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_type.h"
#include "prometheus/text_serializer.h"

#ifndef MER_VERSION
#define MER_VERSION "unknown"
#endif

namespace mer::residency {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

ClientMetric::Label L(std::string name, std::string value) {
  return ClientMetric::Label{std::move(name), std::move(value)};
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void Add(MetricFamily* f, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

MetricFamily Scalar(std::string name, std::string help, MetricType type, double value,
                    std::vector<ClientMetric::Label> labels = {}) {
  MetricFamily f = Family(std::move(name), std::move(help), type);
  Add(&f, value, std::move(labels));
  return f;
}

class SnapshotCollectable : public prometheus::Collectable {
 public:
  SnapshotCollectable(std::function<ResidencyCounters()> snapshot, std::string version)
      : snapshot_(std::move(snapshot)), version_(std::move(version)) {}
  std::vector<MetricFamily> Collect() const override { return ResidencyMetricFamilies(snapshot_(), version_); }

 private:
  std::function<ResidencyCounters()> snapshot_;
  std::string version_;
};

}  // namespace

const char* MerVersion() { return MER_VERSION; }

std::vector<MetricFamily> ResidencyMetricFamilies(const ResidencyCounters& c, const std::string& version) {
  constexpr MetricType kCounter = MetricType::Counter;
  constexpr MetricType kGauge = MetricType::Gauge;
  const std::vector<ClientMetric::Label> ram = {L("tier", "ram")};
  const std::vector<ClientMetric::Label> vram = {L("tier", "vram")};
  std::vector<MetricFamily> out;
  // A VRAM demand is a RAM lookup only as the fill it starts (vram_fills_*), once.
  out.push_back(Scalar(
      "mer_expert_lookups_total",
      "Expert acquisitions by compute: hits it served itself from the table plus "
      "the RAM demand requests it sent (tier=\"ram\" also counts the demanded VRAM "
      "fills, which read the RAM tier).",
      kCounter, double(c.lookups - c.vram_lookups + c.compute_hits + c.vram_fills_from_ram + c.vram_fills_from_store),
      ram));
  {
    MetricFamily f = Family("mer_expert_misses_total",
                            "Expert demands not resident in the tier (a load or upload started or "
                            "joined).",
                            kCounter);
    Add(&f, double(c.misses + c.vram_fills_from_store), ram);
    Add(&f, double(c.vram_misses), vram);
    out.push_back(std::move(f));
  }
  out.push_back(Scalar("mer_expert_upload_bytes_total",
                       "Bytes copied from the RAM tier into compute's VRAM arena (CUDA IPC).", kCounter,
                       double(c.vram_upload_bytes)));
  out.push_back(Scalar("mer_expert_uploads_total",
                       "Experts copied from the RAM tier into compute's VRAM arena and published.", kCounter,
                       double(c.vram_uploads)));
  out.push_back(Scalar("mer_expert_read_bytes_total", "Bytes of expert blobs read from the store (refetches included).",
                       kCounter, double(c.bytes_read)));
  {
    MetricFamily h =
        Family("mer_io_read_seconds", "Latency of expert blob reads, submit to completion.", MetricType::Histogram);
    ClientMetric m;
    uint64_t cumulative = 0;
    for (size_t b = 0; b < kReadLatencyBucketsSeconds.size(); ++b) {
      cumulative += c.read_latency_buckets[b];
      m.histogram.bucket.push_back({cumulative, kReadLatencyBucketsSeconds[b]});
    }
    cumulative += c.read_latency_buckets.back();
    m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = c.read_latency_seconds_total;
    h.metric.push_back(std::move(m));
    out.push_back(std::move(h));
  }
  out.push_back(Scalar("mer_io_inflight", "Expert blob reads in flight.", kGauge, double(c.io_inflight)));
  {
    MetricFamily f = Family("mer_evictions_total", "Resident experts evicted to free a slot.", kCounter);
    Add(&f, double(c.evictions), ram);
    Add(&f, double(c.vram_evictions), vram);
    out.push_back(std::move(f));
  }
  out.push_back(Scalar("mer_vram_demotions_total",
                       "Experts evicted from the VRAM arena and copied back into the RAM tier (exclusive "
                       "tiers).",
                       kCounter, double(c.vram_demotions)));
  out.push_back(Scalar("mer_vram_demotion_bytes_total", "Bytes of those copies (VRAM -> RAM).", kCounter,
                       double(c.vram_demotion_bytes)));
  out.push_back(Scalar("mer_expert_stall_seconds_total",
                       "Time demanded experts waited for their reads: demand received to "
                       "completion pushed, summed over demands that missed.",
                       kCounter, double(c.stall_ns_total) * 1e-9, ram));
  // RAM prefetch unlabelled (as before the VRAM tier), VRAM moves with tier="vram".
  const auto prefetch = [&](const char* name, const char* help, uint64_t ram_v, uint64_t vram_v) {
    MetricFamily f = Family(name, help, kCounter);
    Add(&f, double(ram_v), {});
    Add(&f, double(vram_v), vram);
    out.push_back(std::move(f));
  };
  prefetch("mer_prefetch_issued_total",
           "Prefetches started: storage reads into RAM, and (tier=\"vram\") uploads into VRAM.", c.prefetch_issued,
           c.vram_prefetch_issued);
  prefetch("mer_prefetch_useful_total", "Prefetched experts used before their eviction.", c.prefetch_useful,
           c.vram_prefetch_useful);
  prefetch("mer_prefetch_wasted_total", "Prefetched experts evicted (or failed) unused.", c.prefetch_wasted,
           c.vram_prefetch_wasted);
  {
    MetricFamily f = Family("mer_tier_slots", "Slots of the tier by state (last census).", kGauge);
    Add(&f, double(c.slots_free), {L("state", "free"), L("tier", "ram")});
    Add(&f, double(c.slots_resident), {L("state", "resident"), L("tier", "ram")});
    Add(&f, double(c.slots_pinned), {L("state", "pinned"), L("tier", "ram")});
    Add(&f, double(c.slots_loading), {L("state", "loading"), L("tier", "ram")});
    if (c.vram_slots > 0) {  // an arena is imported
      Add(&f, double(c.vram_slots_free), {L("state", "free"), L("tier", "vram")});
      Add(&f, double(c.vram_slots_resident), {L("state", "resident"), L("tier", "vram")});
      Add(&f, double(c.vram_slots_pinned), {L("state", "pinned"), L("tier", "vram")});
      Add(&f, double(c.vram_slots_filling), {L("state", "filling"), L("tier", "vram")});
    }
    out.push_back(std::move(f));
  }
  out.push_back(Scalar("mer_checksum_failures_total", "Expert blobs read whose CRC did not match.", kCounter,
                       double(c.checksum_failures)));
  out.push_back(Scalar("mer_build_info", "Build of mer-residency; always 1.", kGauge, 1.0, {L("version", version)}));
  return out;
}

std::string RenderResidencyMetrics(const ResidencyCounters& c, const std::string& version) {
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, ResidencyMetricFamilies(c, version));
  return os.str();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen,
                                                                    std::function<ResidencyCounters()> snapshot,
                                                                    std::string version) {
  auto endpoint =
      MetricsEndpoint::Start(listen, {std::make_shared<SnapshotCollectable>(std::move(snapshot), std::move(version))});
  if (!endpoint.ok()) return endpoint.status();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(*endpoint)));
}

}  // namespace mer::residency
