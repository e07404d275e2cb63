#include "common/base/flags.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace mer {

absl::StatusOr<Flags> Flags::Parse(const std::vector<std::string>& args, const std::vector<std::string>& value_flags,
                                   const std::vector<std::string>& bool_flags) {
  Flags f;
  const auto known = [](const std::vector<std::string>& v, const std::string& s) {
    return std::find(v.begin(), v.end(), s) != v.end();
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      f.positional_.push_back(a);
      continue;
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (known(bool_flags, name)) {
      if (value) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " takes no value"));
      f.values_[name] = "true";
    } else if (known(value_flags, name)) {
      if (!value) {
        if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
        value = args[++i];
      }
      f.values_[name] = *value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return f;
}

std::string Flags::String(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

absl::StatusOr<int64_t> Flags::Int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v))
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", it->second, "' is not an integer"));
  return v;
}

absl::StatusOr<Flags> Flags::ParseMain(int argc, char** argv, const std::vector<std::string>& value_flags,
                                       const std::vector<std::string>& bool_flags) {
  absl::StatusOr<Flags> f = Parse(std::vector<std::string>(argv + 1, argv + argc), value_flags, bool_flags);
  if (f.ok() && !f->positional_.empty())
    return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", f->positional_[0], "'"));
  return f;
}

absl::StatusOr<int64_t> Flags::IntInRange(const std::string& name, int64_t fallback, int64_t lo, int64_t hi) const {
  absl::StatusOr<int64_t> v = Int(name, fallback);
  if (v.ok() && (*v < lo || *v > hi))
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": want an integer in [", lo, ", ", hi, "], got ", *v));
  return v;
}

absl::StatusOr<std::string> Flags::OneOf(const std::string& name, const std::string& fallback,
                                         const std::vector<std::string>& choices) const {
  const std::string v = String(name, fallback);
  if (std::find(choices.begin(), choices.end(), v) == choices.end())
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, ": '", v, "' is not one of ", absl::StrJoin(choices, ", ")));
  return v;
}

absl::StatusOr<double> Flags::Double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  double v;
  if (!absl::SimpleAtod(it->second, &v))
    return absl::InvalidArgumentError(absl::StrCat("--", name, ": '", it->second, "' is not a number"));
  return v;
}

absl::StatusOr<std::string> Flags::Required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
  return it->second;
}

absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& text, const std::string& what) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    int32_t v;
    if (!absl::SimpleAtoi(piece, &v))
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", piece, "' is not a token id"));
    ids.push_back(v);
  }
  return ids;
}

}  // namespace mer
