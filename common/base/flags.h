// The command-line flag parser of the `mer` subcommands and the daemons: `--name value`,
// `--name=value` and boolean `--name`. Each program declares its flags; unknown flags and bad
// values are errors that name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mer {

class Flags {
 public:
  // `value_flags` take a value; `bool_flags` do not.
  static absl::StatusOr<Flags> Parse(const std::vector<std::string>& args, const std::vector<std::string>& value_flags,
                                     const std::vector<std::string>& bool_flags);
  // A daemon's argv (after the program name); positional arguments are errors.
  static absl::StatusOr<Flags> ParseMain(int argc, char** argv, const std::vector<std::string>& value_flags,
                                         const std::vector<std::string>& bool_flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string String(const std::string& name, const std::string& fallback = "") const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  // Int, and InvalidArgument naming the flag and the range unless lo <= value <= hi.
  absl::StatusOr<int64_t> IntInRange(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const;
  // A value that must be one of `choices`.
  absl::StatusOr<std::string> OneOf(const std::string& name, const std::string& fallback,
                                    const std::vector<std::string>& choices) const;
  absl::StatusOr<double> Double(const std::string& name, double fallback) const;
  absl::StatusOr<std::string> Required(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// "1,2,3" -> {1, 2, 3}; InvalidArgument naming `what` on a malformed list.
absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& text, const std::string& what);

}  // namespace mer
