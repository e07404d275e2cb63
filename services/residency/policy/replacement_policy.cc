#include "services/residency/policy/replacement_policy.h"

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "services/residency/policy/arc_policy.h"
#include "services/residency/policy/lfu_policy.h"
#include "services/residency/policy/lru_policy.h"

namespace mer::residency {

ReplacementPolicy::ReplacementPolicy(int64_t capacity) : capacity_(capacity) {
  CHECK_MSG(capacity >= 1 && capacity <= kMaxCapacity, "policy capacity out of range");
}

absl::StatusOr<std::unique_ptr<ReplacementPolicy>> CreatePolicy(absl::string_view name, int64_t capacity) {
  if (capacity < 1 || capacity > ReplacementPolicy::kMaxCapacity)
    return absl::InvalidArgumentError(
        absl::StrCat("cache capacity ", capacity, " is outside [1, ", ReplacementPolicy::kMaxCapacity, "]"));
  if (name == "lru") return std::make_unique<LruPolicy>(capacity);
  if (name == "lfu") return std::make_unique<LfuPolicy>(capacity);
  if (name == "arc") return std::make_unique<ArcPolicy>(capacity);
  return absl::InvalidArgumentError(absl::StrCat("unknown replacement policy '", name, "' (lru, lfu or arc)"));
}

const std::vector<std::string>& PolicyNames() {
  static const auto* names = new std::vector<std::string>{"lru", "lfu", "arc"};
  return *names;
}

}  // namespace mer::residency
