// libFuzzer target for the gateway's parser of the Prometheus text format
// (services/gateway/metrics_merge.h), which reads the pages of the other daemons: any bytes must
// parse or fail cleanly, and what parses must serialize and parse again.
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "common/base/check.h"
#include "prometheus/text_serializer.h"
#include "services/gateway/metrics_merge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto families = mer::gateway::ParseMetricsText(text);
  if (!families.ok()) return 0;
  mer::gateway::AddLabel(&*families, "daemon", "fuzz");
  std::vector<prometheus::MetricFamily> merged;
  mer::gateway::MergeFamilies(&merged, std::move(*families));
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, merged);
  CHECK(mer::gateway::ParseMetricsText(os.str()).ok());
  return 0;
}
