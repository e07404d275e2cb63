// One /metrics page for the host: the gateway's own families and those scraped from mer-compute
// and mer-residency, every sample labelled with the daemon it came from (daemon="gateway",
// "compute", "residency"; a sample that already has a daemon label keeps it), families of the
// same name merged into one (so mer_build_info or mer_generated_tokens_total appear once, with
// a series per daemon, and the page passes `promtool check metrics`).
//
// ParseMetricsText reads the Prometheus text exposition format as prometheus-cpp writes it
// (HELP/TYPE comments, counters, gauges, untyped, histograms, summaries). HELP text is kept in
// its escaped form, since prometheus-cpp's serializer writes help as is; label values are
// unescaped (it escapes them). Bad metric or label names, values or lines are InvalidArgument.
//
// Thread-safety: pure functions; HttpGet blocks the calling thread up to its timeout.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "prometheus/metric_family.h"

namespace mer::gateway {

absl::StatusOr<std::vector<prometheus::MetricFamily>> ParseMetricsText(absl::string_view text);

// Adds name="<value>" to every metric that has no label `name` (daemon="compute", rank="1").
void AddLabel(std::vector<prometheus::MetricFamily>* families, const std::string& name, const std::string& value);

// Appends `more` to `into`, merging families with an existing name (the first HELP and TYPE
// win; a family whose TYPE disagrees with the first is dropped).
void MergeFamilies(std::vector<prometheus::MetricFamily>* into, std::vector<prometheus::MetricFamily> more);

// GET of an http://HOST:PORT/PATH URL; the body of a 200 answer.
absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout);

}  // namespace mer::gateway
