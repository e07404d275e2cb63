#include "tools/trace/rank_load.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "services/compute/expert_parallel.h"

namespace mer::trace {

absl::StatusOr<RankLoadStats> RankLoad(const RoutingTrace& trace, const RankLoadOptions& o) {
  RETURN_IF_ERROR(ValidateTraceGeometry(trace.geometry()));
  const TraceGeometry& g = trace.geometry();
  if (o.replicate_per_layer < 0 || o.replicate_per_layer > g.n_expert)
    return absl::InvalidArgumentError(
        absl::StrCat("replication of ", o.replicate_per_layer, " experts per layer: must be in [0, ", g.n_expert, "]"));
  // One placement stands for every rank: they assign alike.
  ASSIGN_OR_RETURN(ExpertPlacement placement, ExpertPlacement::Create(o.n_ranks, 0));
  if (o.replicate_per_layer > 0) {  // the most used over the whole trace, as the served ranks count
    HotExpertCounter hot(g.n_layer, g.n_expert);
    std::vector<int32_t> ids;
    for (size_t r = 0; r < trace.records().size(); ++r)
      for (int l = 0; l < g.n_layer; ++l) {
        const absl::Span<const uint16_t> e = trace.Experts(r, l);
        ids.assign(e.begin(), e.end());
        hot.Count(l, ids);
      }
    for (const auto& [layer, expert] : hot.ChooseAndAge(o.replicate_per_layer)) placement.Replicate(layer, expert);
  }
  RankLoadStats s;
  s.n_ranks = o.n_ranks;
  std::vector<int32_t> experts, runners;
  std::vector<int64_t> load(o.n_ranks);
  for (size_t r = 0; r < trace.records().size(); ++r) {
    if (!o.count_prompt && trace.records()[r].phase != TracePhase::kDecode) continue;
    for (int l = 0; l < g.n_layer; ++l) {
      const absl::Span<const uint16_t> ids = trace.Experts(r, l);
      experts.assign(ids.begin(), ids.end());
      runners.resize(experts.size());
      placement.AssignRunners(l, experts, absl::MakeSpan(runners), absl::MakeSpan(load));
      ++s.layer_steps;
      s.pairs += static_cast<int64_t>(experts.size());
      s.busiest_pairs += *std::max_element(load.begin(), load.end());
    }
  }
  return s;
}

}  // namespace mer::trace
