// mer-compute's backend metrics: the cuda backend's VRAM tier slots on its page, and not there
// once mer-residency places the arena's experts (its own page reports them by state).
#include "services/compute/daemon/compute_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "prometheus/collectable.h"
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
  BackendStats s;
  s.arena_slots = 10;
  s.arena_resident = 4;
  s.expert_lookups = 7;
  m.OnBackendStats(s);
  std::string page = Page(m);
  EXPECT_THAT(page, HasSubstr("mer_tier_slots{state=\"resident\",tier=\"vram\"} 4\n"));
  EXPECT_THAT(page, HasSubstr("mer_tier_slots{state=\"free\",tier=\"vram\"} 6\n"));

  s.arena_placed_by_residency = true;
  s.arena_resident = 0;  // what the engine knows then
  s.expert_lookups = 9;
  m.OnBackendStats(s);
  m.OnBackendStats(s);  // and again: dropped once
  page = Page(m);
  EXPECT_THAT(page, Not(HasSubstr("mer_tier_slots{")));
  EXPECT_THAT(page, HasSubstr("mer_expert_lookups_total{tier=\"vram\"} 9\n"));  // the rest stays
}

TEST(ComputeMetricsTest, TheCpuBackendHasNoVramFamilies) {
  ComputeMetrics m("test", "cpu", {});
  EXPECT_THAT(Page(m), Not(HasSubstr("tier=\"vram\"")));
}

}  // namespace
}  // namespace mer::compute
