// A Jinja2 subset for chat templates (the `tokenizer.chat_template` of GGUF files), rendered the
// way Hugging Face transformers renders them (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and the loopcontrols extension; `tojson` as
// json.dumps(ensure_ascii=False); the globals raise_exception and strftime_now), which is the
// reference vLLM uses and llama.cpp imitates.
//
// Supported:
//  - text, {{ expr }}, {% stmt %}, {# comment #}, with "-" and "+" whitespace control;
//  - if/elif/else, for (one or two targets, an inline `if` filter, else, loop.index, index0,
//    revindex, revindex0, first, last, length, previtem, nextitem), break, continue, set (names,
//    namespace attributes, block set), generation/endgeneration (transparent);
//  - literals (strings with Python escapes, ints, floats, true/false/none in either case, lists,
//    dicts, tuples as lists), attribute and item access, slices, `if` expressions, the operators
//    or, and, not, in, not in, is [not], == != < > <= >=, + - * / // % **, ~ and unary -/+;
//  - string methods (startswith, endswith, split, rsplit, strip, lstrip, rstrip, upper, lower,
//    title, capitalize, replace, find, count, join, splitlines), dict methods (items, keys,
//    values, get);
//  - the filters and tests listed in jinja.cc (length, tojson, trim, join, default, map,
//    selectattr, ...; defined, none, string, mapping, ...), and namespace(), range(), dict().
// Not supported (a parse or render error, never a wrong render): macros, call blocks, filter
// blocks, include/import/extends, raw blocks, and a namespace that holds itself (directly or
// through lists, dicts and other namespaces: Python allows it, but the cycle would have every
// printer and comparison here recurse without end). upper/lower/title/capitalize change ASCII
// letters only.
//
// Limits (inputs are untrusted): nesting depth, output size and loop iterations are bounded; a
// template that exceeds them fails to parse or render with InvalidArgument.
//
// Thread-safety: a Template is immutable; Render may run on any number of threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace mer::jinja {

// A template value: Python's None, bool, int, float, str, list and dict (insertion-ordered), and
// jinja2's Undefined. Lists and dicts are shared, as Python's objects are (namespace attributes
// assigned inside a loop are seen after it). Only a namespace changes once made.
class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;

  Value() = default;  // undefined
  static Value None();
  Value(bool b) : kind_(Kind::kBool), int_(b) {}
  Value(int v) : kind_(Kind::kInt), int_(v) {}
  Value(int64_t v) : kind_(Kind::kInt), int_(v) {}
  Value(double v) : kind_(Kind::kFloat), float_(v) {}
  Value(std::string s) : kind_(Kind::kString), string_(std::make_shared<std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  static Value MakeArray(Array items = {});
  static Value MakeTuple(Array items);  // an array that prints as Python's tuple
  static Value MakeObject(Object members = {});

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_tuple() const { return tuple_; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool bool_value() const { return int_ != 0; }
  int64_t int_value() const { return int_; }
  double float_value() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& string_value() const { return *string_; }
  const Array& array() const { return *array_; }
  const Object& object() const { return *object_; }

  // Object members: the value of `key`, or null.
  const Value* Find(std::string_view key) const;
  // Sets (or adds) an object member.
  void Set(std::string_view key, Value value) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool tuple_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<std::string> string_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
};

struct Node;

class Template {
 public:
  // InvalidArgument naming the line of a syntax error or of an unsupported tag.
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with the members of `context` (an object) as the template's variables.
  // InvalidArgument on a render error (an undefined variable's attribute, a type error,
  // raise_exception(msg), a limit).
  absl::StatusOr<std::string> Render(const Value& context) const;

 private:
  explicit Template(std::shared_ptr<const Node> root) : root_(std::move(root)) {}
  std::shared_ptr<const Node> root_;
};

// Python's repr of a float (shortest round-trip digits; exponent form below 1e-4 and from 1e16).
std::string PythonFloatRepr(double v);

}  // namespace mer::jinja
