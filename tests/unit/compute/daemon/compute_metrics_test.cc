// mer-compute's backend metrics: the cuda backend's VRAM tier slots on its page, and not there
// once mer-residency places the arena's experts (its own page reports them by state).
#include "services/compute/daemon/compute_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace mer::compute {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Page(const ComputeMetrics& m) {
  std::ostringstream os;
  for (const auto& c : m.collectables()) prometheus::TextSerializer().Serialize(os, c->Collect());
  return os.str();
}

TEST(ComputeMetricsTest, VramTierSlotsUnlessResidencyPlacesTheArena) {
  ComputeMetrics m("test", "cuda", {});
  BackendCounters s;
  s.device = true;
  s.arena_slots = 10;
  s.arena_resident = 4;
  s.expert_lookups = 7;
  m.OnBackendCounters(s);
  std::string page = Page(m);
  EXPECT_THAT(page, HasSubstr("mer_tier_slots{state=\"resident\",tier=\"vram\"} 4\n"));
  EXPECT_THAT(page, HasSubstr("mer_tier_slots{state=\"free\",tier=\"vram\"} 6\n"));

  s.arena_placed_by_residency = true;
  s.arena_resident = 0;  // what the engine knows then
  s.expert_lookups = 9;
  m.OnBackendCounters(s);
  m.OnBackendCounters(s);  // and again: dropped once
  page = Page(m);
  EXPECT_THAT(page, Not(HasSubstr("mer_tier_slots{")));
  EXPECT_THAT(page, HasSubstr("mer_expert_lookups_total{tier=\"vram\"} 9\n"));  // the rest stays
}

TEST(ComputeMetricsTest, TheCpuBackendHasNoVramFamilies) {
  ComputeMetrics m("test", "cpu", {});
  EXPECT_THAT(Page(m), Not(HasSubstr("tier=\"vram\"")));
}

// Expert pairs for any backend: one series for one engine, one per rank (with its exchange time)
// for expert-parallel ranks, advanced by the difference between samples.
TEST(ComputeMetricsTest, ExpertPairsOfOneEngineAndByRank) {
  ComputeMetrics one("test", "cpu", {});
  BackendCounters s;
  s.expert_pairs = 40;
  one.OnBackendCounters(s);
  s.expert_pairs = 64;
  one.OnBackendCounters(s);
  EXPECT_THAT(Page(one), HasSubstr("mer_expert_pairs_total 64\n"));
  EXPECT_THAT(Page(one), Not(HasSubstr("mer_expert_exchange_seconds_total")));
  EXPECT_THAT(Page(one), Not(HasSubstr("mer_expert_busiest_rank_pairs_total")));

  ComputeMetrics ranks("test", "cpu", {});
  std::vector<BackendCounters> r(2);
  r[0].expert_pairs = 30;
  r[0].exchange_seconds_x1e6 = 1'500'000;
  r[0].busiest_rank_pairs = r[1].busiest_rank_pairs = 33;
  r[1].expert_pairs = 10;
  r[1].exchange_seconds_x1e6 = 250'000;
  s.expert_pairs = 40;  // their sum, as ExpertParallelBackend::counters gives it
  ranks.OnBackendCounters(s, r);
  r[1].expert_pairs = 26;
  s.expert_pairs = 56;
  s.replicated_experts = 12;
  ranks.OnBackendCounters(s, r);
  const std::string page = Page(ranks);
  EXPECT_THAT(page, HasSubstr("mer_expert_pairs_total{rank=\"0\"} 30\n"));
  EXPECT_THAT(page, HasSubstr("mer_expert_pairs_total{rank=\"1\"} 26\n"));
  EXPECT_THAT(page, HasSubstr("mer_expert_exchange_seconds_total{rank=\"0\"} 1.5\n"));
  EXPECT_THAT(page, HasSubstr("mer_expert_exchange_seconds_total{rank=\"1\"} 0.25\n"));
  EXPECT_THAT(page, HasSubstr("mer_expert_busiest_rank_pairs_total 33\n"));
  EXPECT_THAT(page, HasSubstr("mer_expert_replicas 12\n"));
  EXPECT_THAT(page, Not(HasSubstr("mer_expert_pairs_total 56")));  // no rank-less series beside them
}

// cuda ranks: each device's series labelled by its GPU and rank (two ranks may share a GPU); the
// step-level series (host syncs, graph launches, tokens) once, every rank running every step.
TEST(ComputeMetricsTest, CudaRanksGetDeviceSeriesByGpuAndRank) {
  ComputeMetrics m("test", "cuda", {});
  std::vector<BackendCounters> r(2);
  for (int i = 0; i < 2; ++i) {
    r[i].device = true;
    r[i].gpu = 3 - i;
    r[i].arena_slots = 10;
    r[i].host_syncs = 5;
  }
  r[0].expert_lookups = 100;
  r[0].arena_bytes = 1000;
  r[0].arena_resident = 10;
  r[1].expert_lookups = 60;
  r[1].expert_misses = 4;
  r[1].arena_bytes = 2000;
  r[1].arena_resident = 7;
  BackendCounters s = r[0];  // as ExpertParallelBackend::counters sums them
  s.expert_lookups = 160;
  s.expert_misses = 4;
  m.OnBackendCounters(s, r);
  r[1].expert_lookups = 90;
  s.expert_lookups = 190;
  m.OnBackendCounters(s, r);
  const std::string page = Page(m);
  EXPECT_THAT(page, HasSubstr("mer_expert_lookups_total{gpu=\"3\",rank=\"0\",tier=\"vram\"} 100\n"));
  EXPECT_THAT(page, HasSubstr("mer_expert_lookups_total{gpu=\"2\",rank=\"1\",tier=\"vram\"} 90\n"));
  EXPECT_THAT(page, HasSubstr("mer_expert_misses_total{gpu=\"2\",rank=\"1\",tier=\"vram\"} 4\n"));
  EXPECT_THAT(page, HasSubstr("mer_vram_bytes{gpu=\"3\",rank=\"0\",use=\"arena\"} 1000\n"));
  EXPECT_THAT(page, HasSubstr("mer_vram_bytes{gpu=\"2\",rank=\"1\",use=\"arena\"} 2000\n"));
  EXPECT_THAT(page, HasSubstr("mer_tier_slots{gpu=\"2\",rank=\"1\",state=\"free\",tier=\"vram\"} 3\n"));
  EXPECT_THAT(page, HasSubstr("mer_host_syncs_total 5\n"));
  EXPECT_THAT(page, Not(HasSubstr("mer_expert_lookups_total{tier=\"vram\"}")));  // no unlabelled device series
}

}  // namespace
// A device backend's counters as Prometheus counters: advanced by the difference between samples.
TEST(ComputeMetricsTest, DeviceCountersBecomeCountersForADeviceBackendOnly) {
  const auto value = [](const ComputeMetrics& m, const std::string& name,
                        const std::string& label) -> std::optional<double> {
    for (const auto& c : m.collectables())
      for (const prometheus::MetricFamily& f : c->Collect()) {
        if (f.name != name) continue;
        for (const prometheus::ClientMetric& cm : f.metric) {
          bool match = label.empty();
          for (const auto& l : cm.label) match = match || l.value == label;
          if (match) return f.type == prometheus::MetricType::Counter ? cm.counter.value : cm.gauge.value;
        }
      }
    return std::nullopt;
  };
  ComputeMetrics cuda("test", "cuda", nullptr);
  BackendCounters s;
  s.device = true;
  s.expert_lookups = 100;
  s.expert_misses = 10;
  s.host_syncs = 7;
  s.arena_bytes = 4096;
  cuda.OnBackendCounters(s);
  s.expert_lookups = 250;
  s.expert_misses = 12;
  cuda.OnBackendCounters(s);
  EXPECT_EQ(value(cuda, "mer_expert_lookups_total", "vram"), 250);
  EXPECT_EQ(value(cuda, "mer_expert_misses_total", "vram"), 12);
  EXPECT_EQ(value(cuda, "mer_host_syncs_total", ""), 7);
  EXPECT_EQ(value(cuda, "mer_vram_bytes", "arena"), 4096);
  ComputeMetrics cpu("test", "cpu", nullptr);
  s.device = false;  // what the cpu backend's counters say
  cpu.OnBackendCounters(s);
  EXPECT_FALSE(value(cpu, "mer_expert_lookups_total", "").has_value());
}

}  // namespace mer::compute
