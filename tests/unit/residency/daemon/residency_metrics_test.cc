// The Prometheus families of a counters snapshot, and the /metrics endpoint over a real socket.
#include "services/residency/metrics/residency_metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace mer::residency {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ResidencyCounters Sample() {
  ResidencyCounters c;
  c.lookups = 10;
  c.hits = 4;
  c.misses = 6;
  c.reads = 5;
  c.bytes_read = 5 * 4096;
  c.evictions = 2;
  c.checksum_failures = 1;
  c.prefetch_issued = 3;
  c.prefetch_useful = 2;
  c.prefetch_wasted = 1;
  c.stall_ns_total = 1500000000;      // 1.5 s
  c.read_latency_buckets[0] = 2;      // <= 50 us
  c.read_latency_buckets[4] = 2;      // <= 1 ms
  c.read_latency_buckets.back() = 1;  // > 1 s
  c.read_latency_seconds_total = 2.5;
  c.io_inflight = 1;
  c.slots_free = 7;
  c.slots_resident = 3;
  c.slots_pinned = 2;
  c.slots_loading = 1;
  return c;
}

TEST(ResidencyMetricsTest, RendersTheDesignDocNames) {
  const std::string text = RenderResidencyMetrics(Sample(), "1.2.3");
  EXPECT_THAT(text, HasSubstr("# TYPE mer_expert_lookups_total counter"));
  EXPECT_THAT(text, HasSubstr("mer_expert_lookups_total{tier=\"ram\"} 10\n"));
  EXPECT_THAT(text, HasSubstr("mer_expert_misses_total{tier=\"ram\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("mer_expert_read_bytes_total 20480\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE mer_io_read_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("mer_io_read_seconds_bucket{le=\"5e-05\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("mer_io_read_seconds_bucket{le=\"0.001\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("mer_io_read_seconds_bucket{le=\"1\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("mer_io_read_seconds_bucket{le=\"+Inf\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("mer_io_read_seconds_count 5\n"));
  EXPECT_THAT(text, HasSubstr("mer_io_read_seconds_sum 2.5\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE mer_io_inflight gauge"));
  EXPECT_THAT(text, HasSubstr("mer_io_inflight 1\n"));
  EXPECT_THAT(text, HasSubstr("mer_evictions_total{tier=\"ram\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("mer_expert_stall_seconds_total{tier=\"ram\"} 1.5\n"));
  EXPECT_THAT(text, HasSubstr("mer_prefetch_issued_total 3\n"));
  EXPECT_THAT(text, HasSubstr("mer_prefetch_useful_total 2\n"));
  EXPECT_THAT(text, HasSubstr("mer_prefetch_wasted_total 1\n"));
  EXPECT_THAT(text, HasSubstr("mer_tier_slots{state=\"free\",tier=\"ram\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("mer_tier_slots{state=\"resident\",tier=\"ram\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("mer_tier_slots{state=\"pinned\",tier=\"ram\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("mer_tier_slots{state=\"loading\",tier=\"ram\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("mer_checksum_failures_total 1\n"));
  EXPECT_THAT(text, HasSubstr("mer_build_info{version=\"1.2.3\"} 1\n"));
}

// With an arena, a VRAM demand that misses is counted once as a RAM lookup (the fill it starts
// reads RAM, or the store first), not again as the demand itself: 3 RAM demands (1 miss), 8 VRAM
// demands of which 6 missed (2 filled from RAM, 4 from the store) and 5 hits compute pinned itself
// are 3 + 6 + 5 = 14 RAM lookups and 1 + 4 = 5 RAM misses.
TEST(ResidencyMetricsTest, CountsAVramFillAsOneRamLookup) {
  ResidencyCounters c;
  c.lookups = 3 + 8;
  c.hits = 2;
  c.misses = 1;
  c.vram_lookups = 8;
  c.vram_hits = 2;
  c.vram_misses = 6;
  c.vram_fills_from_ram = 2;
  c.vram_fills_from_store = 4;
  c.compute_hits = 5;
  const std::string text = RenderResidencyMetrics(c, "v");
  EXPECT_THAT(text, HasSubstr("mer_expert_lookups_total{tier=\"ram\"} 14\n"));
  EXPECT_THAT(text, HasSubstr("mer_expert_misses_total{tier=\"ram\"} 5\n"));
}

TEST(ResidencyMetricsTest, RendersTheVramTier) {
  ResidencyCounters c;
  EXPECT_THAT(RenderResidencyMetrics(c, "v"), Not(HasSubstr("tier=\"vram\",state")));
  EXPECT_THAT(RenderResidencyMetrics(c, "v"), Not(HasSubstr("state=\"filling\"")));  // no arena yet
  c.vram_upload_bytes = 5013504;
  c.vram_uploads = 1;
  c.vram_evictions = 4;
  c.vram_misses = 6;
  c.vram_prefetch_issued = 9;
  c.vram_prefetch_useful = 7;
  c.vram_prefetch_wasted = 1;
  c.prefetch_issued = 3;
  c.vram_slots = 10;
  c.vram_slots_free = 2;
  c.vram_slots_resident = 5;
  c.vram_slots_pinned = 2;
  c.vram_slots_filling = 1;
  const std::string text = RenderResidencyMetrics(c, "v");
  EXPECT_THAT(text, HasSubstr("mer_expert_upload_bytes_total 5013504\n"));
  EXPECT_THAT(text, HasSubstr("mer_evictions_total{tier=\"vram\"} 4\n"));
  EXPECT_THAT(text, HasSubstr("mer_expert_misses_total{tier=\"vram\"} 6\n"));
  EXPECT_THAT(text, HasSubstr("mer_prefetch_issued_total 3\n"));  // RAM, as before
  EXPECT_THAT(text, HasSubstr("mer_prefetch_issued_total{tier=\"vram\"} 9\n"));
  EXPECT_THAT(text, HasSubstr("mer_prefetch_useful_total{tier=\"vram\"} 7\n"));
  EXPECT_THAT(text, HasSubstr("mer_prefetch_wasted_total{tier=\"vram\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("mer_tier_slots{state=\"filling\",tier=\"vram\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("mer_tier_slots{state=\"resident\",tier=\"vram\"} 5\n"));
}

TEST(ResidencyMetricsTest, RejectsABadListenAddress) {
  auto none = [] { return ResidencyCounters{}; };
  EXPECT_EQ(MetricsServer::Start("nonsense", none).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsServer::Start("127.0.0.1:99999", none).status().code(), absl::StatusCode::kInvalidArgument);
}

// GET `path` from 127.0.0.1:port; the whole response (headers and body).
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

TEST(ResidencyMetricsTest, ServesSnapshotsOnAFreePort) {
  std::atomic<uint64_t> misses{6};
  auto server = MetricsServer::Start("127.0.0.1:0", [&] {
    ResidencyCounters c = Sample();
    c.misses = misses.load();
    return c;
  });
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string((*server)->port()) + "/metrics");
  std::string page = HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(page, HasSubstr("200 OK"));
  EXPECT_THAT(page, HasSubstr("mer_expert_misses_total{tier=\"ram\"} 6\n"));
  misses = 42;  // every scrape takes a fresh snapshot
  page = HttpGet((*server)->port(), "/metrics");
  EXPECT_THAT(page, HasSubstr("mer_expert_misses_total{tier=\"ram\"} 42\n"));
  EXPECT_THAT(page, Not(HasSubstr("mer_expert_misses_total{tier=\"ram\"} 6\n")));
}

}  // namespace
}  // namespace mer::residency
