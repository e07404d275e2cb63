// mer-compute's backend metrics: the cuda backend's VRAM tier slots on its page, and not there
// once mer-residency places the arena's experts (its own page reports them by state).
#include "services/compute/daemon/compute_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <string>

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
