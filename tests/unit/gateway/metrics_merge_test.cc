#include "services/gateway/metrics_merge.h"

#include <gtest/gtest.h>

#include <sstream>

#include "prometheus/text_serializer.h"

namespace mer::gateway {
namespace {

constexpr char kCompute[] = R"(# HELP mer_generated_tokens_total Tokens sampled.
# TYPE mer_generated_tokens_total counter
mer_generated_tokens_total 26
# HELP mer_build_info Build of the daemon; always 1.
# TYPE mer_build_info gauge
mer_build_info{backend="cpu",daemon="compute",version="0.1.0"} 1
# HELP mer_step_seconds Duration of one step.
# TYPE mer_step_seconds histogram
mer_step_seconds_count 3
mer_step_seconds_sum 0.25
mer_step_seconds_bucket{le="0.1"} 1
mer_step_seconds_bucket{le="1"} 3
mer_step_seconds_bucket{le="+Inf"} 3
)";

constexpr char kResidency[] = R"(# HELP mer_build_info Build of mer-residency; always 1.
# TYPE mer_build_info gauge
mer_build_info{version="0.1.0"} 1
# HELP mer_tier_slots Slots "of the tier" \\ by state.
# TYPE mer_tier_slots gauge
mer_tier_slots{state="free",tier="ram"} 4
mer_tier_slots{state="pinned",tier="ram"} 2
)";

std::string Serialize(const std::vector<prometheus::MetricFamily>& f) {
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, f);
  return os.str();
}

TEST(MetricsMergeTest, ParsesAndRoundTrips) {
  auto f = ParseMetricsText(kCompute);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->size(), 3u);
  EXPECT_EQ((*f)[0].metric[0].counter.value, 26);
  const auto& h = (*f)[2].metric.at(0).histogram;
  EXPECT_EQ(h.sample_count, 3u);
  EXPECT_DOUBLE_EQ(h.sample_sum, 0.25);
  ASSERT_EQ(h.bucket.size(), 3u);
  EXPECT_EQ(h.bucket[1].cumulative_count, 3u);
  EXPECT_TRUE(std::isinf(h.bucket[2].upper_bound));
  auto again = ParseMetricsText(Serialize(*f));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Serialize(*again), Serialize(*f));
}

TEST(MetricsMergeTest, MergesFamiliesAndLabelsDaemons) {
  auto c = ParseMetricsText(kCompute);
  auto r = ParseMetricsText(kResidency);
  ASSERT_TRUE(c.ok() && r.ok());
  EXPECT_EQ((*r)[1].help, "Slots \"of the tier\" \\\\ by state.");  // kept escaped
  std::vector<prometheus::MetricFamily> all;
  AddLabel(&*c, "daemon", "compute");
  AddLabel(&*r, "daemon", "residency");
  MergeFamilies(&all, std::move(*c));
  MergeFamilies(&all, std::move(*r));
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[1].name, "mer_build_info");
  ASSERT_EQ(all[1].metric.size(), 2u);  // one family, a series per daemon
  const std::string text = Serialize(all);
  EXPECT_NE(text.find(R"(mer_build_info{daemon="residency",version="0.1.0"} 1)"), std::string::npos) << text;
  EXPECT_NE(text.find(R"(daemon="compute",version="0.1.0")"), std::string::npos) << text;
  EXPECT_EQ(text.find("# TYPE mer_build_info"), text.rfind("# TYPE mer_build_info"));
  EXPECT_NE(text.find(R"(mer_step_seconds_bucket{daemon="compute",le="0.1"} 1)"), std::string::npos) << text;
}

TEST(MetricsMergeTest, RejectsMalformedText) {
  EXPECT_FALSE(ParseMetricsText("# TYPE x wrongtype\n").ok());
  EXPECT_FALSE(ParseMetricsText(" 1\n").ok());             // no name (found by metrics_text_fuzz)
  EXPECT_FALSE(ParseMetricsText("x{1a=\"b\"} 1\n").ok());  // bad label name
  EXPECT_FALSE(ParseMetricsText("# TYPE 9x gauge\n").ok());
  EXPECT_FALSE(ParseMetricsText("x{a=\"b} 1\n").ok());
  EXPECT_FALSE(ParseMetricsText("x 1z\n").ok());
}

}  // namespace
}  // namespace mer::gateway
