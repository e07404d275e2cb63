#include "common/chat/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer::jinja {

// ---------------------------------------------------------------------------------------------
// Values

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::MakeArray(Array items) {
  Value v;
  v.kind_ = Kind::kArray;
  v.array_ = std::make_shared<Array>(std::move(items));
  return v;
}

Value Value::MakeTuple(Array items) {
  Value v = MakeArray(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::MakeObject(Object members) {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::make_shared<Object>(std::move(members));
  return v;
}

const Value* Value::Find(std::string_view key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (const auto& [k, v] : *object_)
    if (k == key) return &v;
  return nullptr;
}

void Value::Set(std::string_view key, Value value) const {
  for (auto& [k, v] : *object_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  object_->emplace_back(std::string(key), std::move(value));
}

namespace {

constexpr int kMaxDepth = 200;                        // nesting of expressions and blocks
constexpr size_t kMaxOutputBytes = size_t{16} << 20;  // of a render, and of any string made
constexpr int64_t kMaxIterations = 1 << 20;           // loop iterations of a render, in all

absl::Status Error(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template: ", what));
}

bool IsSpaceAscii(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.isspace for the code point starting at s[i]; its byte length in *n.
bool IsPySpace(std::string_view s, size_t i, size_t* n) {
  const auto b = static_cast<unsigned char>(s[i]);
  *n = 1;
  if (b < 0x80) return IsSpaceAscii(static_cast<char>(b)) || (b >= 0x1c && b <= 0x1f);
  auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (b == 0xC2 && (at(1) == 0x85 || at(1) == 0xA0)) return *n = 2, true;
  if (b == 0xE1 && at(1) == 0x9A && at(2) == 0x80) return *n = 3, true;  // U+1680
  if (b == 0xE2 && at(1) == 0x80 && (at(2) <= 0x8A || at(2) == 0xA8 || at(2) == 0xA9 || at(2) == 0xAF))
    return *n = 3, true;                                                 // U+2000..200A, 2028, 2029, 202F
  if (b == 0xE2 && at(1) == 0x81 && at(2) == 0x9F) return *n = 3, true;  // U+205F
  if (b == 0xE3 && at(1) == 0x80 && at(2) == 0x80) return *n = 3, true;  // U+3000
  return false;
}

// The start of the last code point before byte `end`.
size_t PrevCodePoint(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return i;
}

std::string_view PyStripWhitespace(std::string_view s, bool left, bool right) {
  size_t n;
  if (left) {
    while (!s.empty() && IsPySpace(s, 0, &n)) s.remove_prefix(n);
  }
  if (right) {
    while (!s.empty()) {
      const size_t i = PrevCodePoint(s, s.size());
      if (!IsPySpace(s, i, &n) || i + n != s.size()) break;
      s.remove_suffix(n);
    }
  }
  return s;
}

// Code points of `chars` (UTF-8).
std::vector<std::string_view> CodePoints(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t j = i + 1;
    while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) ++j;
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string_view PyStripChars(std::string_view s, std::string_view chars, bool left, bool right) {
  const std::vector<std::string_view> set = CodePoints(chars);
  auto in_set = [&](std::string_view cp) { return std::find(set.begin(), set.end(), cp) != set.end(); };
  if (left) {
    while (!s.empty()) {
      const std::string_view cp = CodePoints(s.substr(0, std::min<size_t>(4, s.size())))[0];
      if (!in_set(cp)) break;
      s.remove_prefix(cp.size());
    }
  }
  if (right) {
    while (!s.empty()) {
      const size_t i = PrevCodePoint(s, s.size());
      if (!in_set(s.substr(i))) break;
      s.remove_suffix(s.size() - i);
    }
  }
  return s;
}

size_t CodePointCount(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string PyStringRepr(const std::string& s) {
  const char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7f) {
      absl::StrAppend(&out, "\\x", absl::Hex(b, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  *out += '"';
  for (char c : s) {
    const auto b = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (b < 0x20)
          absl::StrAppend(out, "\\u00", absl::Hex(b, absl::kZeroPad2));
        else
          *out += c;
    }
  }
  *out += '"';
}

std::string Str(const Value& v);

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return PyStringRepr(v.string_value());
    case Value::Kind::kArray: {
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < v.array().size(); ++i) absl::StrAppend(&out, i ? ", " : "", Repr(v.array()[i]));
      if (v.is_tuple()) return out + (v.array().size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Kind::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, m] : v.object()) {
        absl::StrAppend(&out, first ? "" : ", ", PyStringRepr(k), ": ", Repr(m));
        first = false;
      }
      return out + "}";
    }
    default:
      return Str(v);
  }
}

// Python's str(), with jinja2's Undefined printing as nothing.
std::string Str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.bool_value() ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(v.int_value());
    case Value::Kind::kFloat:
      return PythonFloatRepr(v.float_value());
    case Value::Kind::kString:
      return v.string_value();
    default:
      return Repr(v);
  }
}

// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none).
absl::Status ToJson(const Value& v, int indent, int level, std::string* out) {
  if (out->size() > kMaxOutputBytes) return Error("output too large");
  auto newline = [&](int l) {
    if (indent < 0) return;
    *out += '\n';
    out->append(static_cast<size_t>(indent) * l, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Error("tojson of an undefined value");
    case Value::Kind::kNone:
      *out += "null";
      break;
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      break;
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      break;
    case Value::Kind::kFloat: {
      const double d = v.float_value();
      *out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : PythonFloatRepr(d);
      break;
    }
    case Value::Kind::kString:
      JsonString(v.string_value(), out);
      break;
    case Value::Kind::kArray: {
      if (v.array().empty()) {
        *out += "[]";
        break;
      }
      *out += '[';
      for (size_t i = 0; i < v.array().size(); ++i) {
        if (i) *out += indent < 0 ? ", " : ",";
        newline(level + 1);
        RETURN_IF_ERROR(ToJson(v.array()[i], indent, level + 1, out));
      }
      newline(level);
      *out += ']';
      break;
    }
    case Value::Kind::kObject: {
      if (v.object().empty()) {
        *out += "{}";
        break;
      }
      *out += '{';
      bool first = true;
      for (const auto& [k, m] : v.object()) {
        if (!first) *out += indent < 0 ? ", " : ",";
        first = false;
        newline(level + 1);
        JsonString(k, out);
        *out += ": ";
        RETURN_IF_ERROR(ToJson(m, indent, level + 1, out));
      }
      newline(level);
      *out += '}';
      break;
    }
  }
  return absl::OkStatus();
}

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.int_value() != 0;
    case Value::Kind::kFloat:
      return v.float_value() != 0;
    case Value::Kind::kString:
      return !v.string_value().empty();
    case Value::Kind::kArray:
      return !v.array().empty();
    case Value::Kind::kObject:
      return !v.object().empty();
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() || a.kind() == Value::Kind::kBool) {
    if (!(b.is_number() || b.kind() == Value::Kind::kBool)) return false;
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) return a.float_value() == b.float_value();
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kString:
      return a.string_value() == b.string_value();
    case Value::Kind::kArray:
      if (a.array().size() != b.array().size()) return false;
      for (size_t i = 0; i < a.array().size(); ++i)
        if (!Equal(a.array()[i], b.array()[i])) return false;
      return true;
    case Value::Kind::kObject:
      if (a.object().size() != b.object().size()) return false;
      for (const auto& [k, v] : a.object()) {
        const Value* o = b.Find(k);
        if (o == nullptr || !Equal(v, *o)) return false;
      }
      return true;
    default:
      return true;  // none == none, undefined == undefined
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Syntax tree

enum class Op {
  // expressions
  kLiteral,
  kName,
  kList,
  kDict,
  kAttr,
  kItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kNot,
  kNeg,
  kPos,
  kAnd,
  kOr,
  kCond,
  kBinary,
  kCompare,
  // statements
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kBreak,
  kContinue,
  kSequence,
};

struct Node {
  Op op;
  int line = 0;
  Value value;                                    // kLiteral, kText
  std::string name;                               // kName, kAttr, kFilter, kTest, kBinary/kCompare op, kSet target
  std::string attr;                               // kSet: namespace attribute
  std::vector<std::shared_ptr<const Node>> kids;  // operands, bodies
  std::vector<std::string> keywords;              // kCall/kFilter/kTest: names of the last args
  std::vector<std::string> targets;               // kFor
};

namespace {

using NodePtr = std::shared_ptr<const Node>;

NodePtr Make(Op op, int line, std::vector<NodePtr> kids = {}, std::string name = {}) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->line = line;
  n->kids = std::move(kids);
  n->name = std::move(name);
  return n;
}

// ---------------------------------------------------------------------------------------------
// Lexer: the template splits into text and tags (with jinja2's whitespace control), each tag's
// inside into tokens.

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type;
  std::string text;  // name, operator or decoded string
  int64_t int_value = 0;
  double float_value = 0;
};

struct Segment {
  enum Kind { kText, kOutput, kStatement } kind;
  std::string text;  // kText: the text; else the tag's inside
  int line;
};

absl::Status DecodeString(std::string_view body, std::string* out) {
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      *out += c;
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int digits) -> absl::Status {
      uint32_t cp = 0;
      for (int k = 1; k <= digits; ++k) {
        if (i + k >= body.size()) return Error("bad escape in a string");
        const char h = body[i + k];
        const int d = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                             : -1;
        if (d < 0) return Error("bad escape in a string");
        cp = cp * 16 + d;
      }
      i += digits;
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return Error("bad code point in a string");
      if (cp < 0x80) {
        *out += static_cast<char>(cp);
      } else if (cp < 0x800) {
        *out += static_cast<char>(0xC0 | (cp >> 6));
        *out += static_cast<char>(0x80 | (cp & 0x3F));
      } else if (cp < 0x10000) {
        *out += static_cast<char>(0xE0 | (cp >> 12));
        *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *out += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        *out += static_cast<char>(0xF0 | (cp >> 18));
        *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        *out += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return absl::OkStatus();
    };
    switch (e) {
      case 'n':
        *out += '\n';
        break;
      case 't':
        *out += '\t';
        break;
      case 'r':
        *out += '\r';
        break;
      case 'b':
        *out += '\b';
        break;
      case 'f':
        *out += '\f';
        break;
      case 'v':
        *out += '\v';
        break;
      case 'a':
        *out += '\a';
        break;
      case '0':
        *out += '\0';
        break;
      case '\\':
        *out += '\\';
        break;
      case '\'':
        *out += '\'';
        break;
      case '"':
        *out += '"';
        break;
      case '\n':
        break;  // a line continuation
      case 'x':
        RETURN_IF_ERROR(hex(2));
        break;
      case 'u':
        RETURN_IF_ERROR(hex(4));
        break;
      case 'U':
        RETURN_IF_ERROR(hex(8));
        break;
      default:
        *out += '\\';
        *out += e;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view s) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (IsSpaceAscii(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Tok::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      std::string text(s.substr(i, j - i));
      std::erase(text, '_');
      Token t{is_float ? Tok::kFloat : Tok::kInt, text};
      if (is_float) {
        t.float_value = std::strtod(text.c_str(), nullptr);
      } else {
        const auto r = std::from_chars(text.data(), text.data() + text.size(), t.int_value);
        if (r.ec != std::errc()) return Error("integer literal out of range");
      }
      out.push_back(std::move(t));
      i = j;
    } else if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != c) j += s[j] == '\\' ? 2 : 1;
      if (j >= s.size()) return Error("unterminated string");
      Token t{Tok::kString, ""};
      RETURN_IF_ERROR(DecodeString(s.substr(i + 1, j - i - 1), &t.text));
      out.push_back(std::move(t));
      i = j + 1;
    } else {
      static constexpr std::string_view kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*", "/", "%",
                                                  "~",  "|",  ".",  ",",  ":",  "(",  ")", "[", "]", "{", "}", "="};
      bool found = false;
      for (std::string_view op : kOps) {
        if (s.substr(i, op.size()) == op) {
          out.push_back({Tok::kOp, std::string(op)});
          i += op.size();
          found = true;
          break;
        }
      }
      if (!found) return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

// The end of the tag whose inside starts at `from`: its closing "}}" or "%}" outside strings and
// brackets (as jinja2's lexer balances them, so `{{ {'a': {}} }}` ends at the last "}}").
size_t FindTagEnd(std::string_view src, size_t from, std::string_view close) {
  int depth = 0;
  for (size_t i = from; i + 1 < src.size(); ++i) {
    const char c = src[i];
    if (c == '\'' || c == '"') {
      size_t j = i + 1;
      while (j < src.size() && src[j] != c) j += src[j] == '\\' ? 2 : 1;
      i = j;
      continue;
    }
    if (depth == 0 && src.compare(i, close.size(), close) == 0) return i;
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
  }
  return std::string_view::npos;
}

// jinja2 reads the source as str.splitlines() joined with "\n": every line break (\r\n, \r, \v, \f,
// \x1c-\x1e, U+0085, U+2028, U+2029) becomes "\n", and one trailing line break is dropped.
std::string NormalizeNewlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '\r') {
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      out += '\n';
    } else if (c == '\n' || c == '\v' || c == '\f' || c == '\x1c' || c == '\x1d' || c == '\x1e') {
      out += '\n';
    } else if (c == '\xC2' && i + 1 < src.size() && src[i + 1] == '\x85') {
      out += '\n';
      ++i;
    } else if (c == '\xE2' && i + 2 < src.size() && src[i + 1] == '\x80' &&
               (src[i + 2] == '\xA8' || src[i + 2] == '\xA9')) {
      out += '\n';
      i += 2;
    } else {
      out += c;
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int LineAt(std::string_view src, size_t pos) {
  return 1 + static_cast<int>(std::count(src.begin(), src.begin() + std::min(pos, src.size()), '\n'));
}

absl::StatusOr<std::vector<Segment>> Split(std::string_view src) {
  std::vector<Segment> out;
  size_t pos = 0;
  bool strip_next = false;    // the previous tag ended with "-"
  bool line_starting = true;  // what precedes `pos` ends a line (jinja2's lstrip_blocks rule)
  for (;;) {
    size_t open = pos;
    while ((open = src.find('{', open)) != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      ++open;
    if (open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (strip_next) text = std::string(PyStripWhitespace(text, true, false));
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Segment::kText, std::move(text), LineAt(src, pos)});
      return out;
    }
    const char kind = src[open + 1];
    size_t inner = open + 2;
    const char sign = inner < src.size() ? src[inner] : 0;
    if (sign == '-' || sign == '+') ++inner;
    if (sign == '-') {
      text = std::string(PyStripWhitespace(text, false, true));
    } else if (sign != '+' && kind != '{') {
      const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0
      if (l_pos > 0 || line_starting) {
        const std::string_view rest = std::string_view(text).substr(l_pos);
        if (!rest.empty() && PyStripWhitespace(rest, true, false).empty()) text.resize(l_pos);
      }
    }
    if (!text.empty()) out.push_back({Segment::kText, std::move(text), LineAt(src, pos)});
    const int line = LineAt(src, open);
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = kind == '#' ? src.find(close, inner) : FindTagEnd(src, inner, close);
    if (end == std::string_view::npos) return Error(absl::StrCat("line ", line, ": unclosed tag"));
    size_t inner_end = end;
    strip_next = end > inner && src[end - 1] == '-';
    if (strip_next) --inner_end;
    if (kind != '#') {
      out.push_back({kind == '{' ? Segment::kOutput : Segment::kStatement,
                     std::string(src.substr(inner, inner_end - inner)), line});
    }
    pos = end + 2;
    line_starting = false;
    if (strip_next) {
      size_t p = pos;
      const std::string_view rest = PyStripWhitespace(src.substr(pos), true, false);
      p = src.size() - rest.size();
      line_starting = p > pos && src[p - 1] == '\n';
    } else if (kind != '{' && pos < src.size() && src[pos] == '\n') {
      ++pos;  // trim_blocks
      line_starting = true;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Parser

class Parser {
 public:
  explicit Parser(std::vector<Segment> segments) : segs_(std::move(segments)) {}

  absl::StatusOr<NodePtr> ParseAll() {
    std::string end;
    ASSIGN_OR_RETURN(NodePtr body, ParseBody({}, &end));
    if (!end.empty()) return Error(absl::StrCat("line ", line_, ": unexpected '", end, "'"));
    return body;
  }

 private:
  // Statements until one whose keyword is in `ends` (its keyword goes to *end, its tokens stay
  // in toks_ for the caller) or the end of the template (*end empty).
  absl::StatusOr<NodePtr> ParseBody(const std::vector<std::string>& ends, std::string* end) {
    if (++depth_ > kMaxDepth) return Error("nested too deeply");
    auto seq = std::make_shared<Node>();
    seq->op = Op::kSequence;
    end->clear();
    while (seg_ < segs_.size()) {
      const Segment& s = segs_[seg_++];
      line_ = s.line;
      if (s.kind == Segment::kText) {
        auto t = Make(Op::kText, s.line);
        const_cast<Node&>(*t).value = Value(s.text);
        seq->kids.push_back(t);
        continue;
      }
      ASSIGN_OR_RETURN(toks_, Tokenize(s.text));
      pos_ = 0;
      if (s.kind == Segment::kOutput) {
        ASSIGN_OR_RETURN(NodePtr e, Expression());
        RETURN_IF_ERROR(ExpectEnd());
        seq->kids.push_back(Make(Op::kOutput, s.line, {e}));
        continue;
      }
      if (Peek().type != Tok::kName) return SyntaxError("a statement keyword");
      const std::string kw = Next().text;
      if (std::find(ends.begin(), ends.end(), kw) != ends.end()) {
        *end = kw;
        --depth_;
        return NodePtr(seq);
      }
      ASSIGN_OR_RETURN(NodePtr st, Statement(kw));
      if (st != nullptr) seq->kids.push_back(st);
    }
    --depth_;
    if (!ends.empty()) return Error(absl::StrCat("line ", line_, ": missing '", ends.back(), "'"));
    return NodePtr(seq);
  }

  absl::StatusOr<NodePtr> Statement(const std::string& kw) {
    const int line = line_;
    if (kw == "if") {
      // kids: cond, body, [cond, body]..., [else body]
      auto node = std::make_shared<Node>();
      node->op = Op::kIf;
      node->line = line;
      ASSIGN_OR_RETURN(NodePtr cond, Expression());
      RETURN_IF_ERROR(ExpectEnd());
      for (;;) {
        std::string end;
        ASSIGN_OR_RETURN(NodePtr body, ParseBody({"elif", "else", "endif"}, &end));
        node->kids.push_back(cond);
        node->kids.push_back(body);
        if (end == "elif") {
          ASSIGN_OR_RETURN(cond, Expression());
          RETURN_IF_ERROR(ExpectEnd());
          continue;
        }
        if (end == "else") {
          RETURN_IF_ERROR(ExpectEnd());
          ASSIGN_OR_RETURN(NodePtr other, ParseBody({"endif"}, &end));
          node->kids.push_back(other);
        }
        RETURN_IF_ERROR(ExpectEnd());
        return NodePtr(node);
      }
    }
    if (kw == "for") {
      // kids: iterable, filter (or null), body, else body (or null)
      auto node = std::make_shared<Node>();
      node->op = Op::kFor;
      node->line = line;
      const bool paren = Accept("(");
      do {
        if (Peek().type != Tok::kName) return SyntaxError("a loop variable");
        node->targets.push_back(Next().text);
      } while (Accept(","));
      if (paren && !Accept(")")) return SyntaxError("')'");
      if (!AcceptName("in")) return SyntaxError("'in'");
      ASSIGN_OR_RETURN(NodePtr iter, OrExpr());  // not Expression: `if` here filters
      NodePtr filter;
      if (AcceptName("if")) {
        ASSIGN_OR_RETURN(filter, OrExpr());
      }
      if (AcceptName("recursive")) return Error(absl::StrCat("line ", line, ": recursive loops are not supported"));
      RETURN_IF_ERROR(ExpectEnd());
      std::string end;
      ASSIGN_OR_RETURN(NodePtr body, ParseBody({"else", "endfor"}, &end));
      NodePtr other;
      if (end == "else") {
        RETURN_IF_ERROR(ExpectEnd());
        ASSIGN_OR_RETURN(other, ParseBody({"endfor"}, &end));
      }
      RETURN_IF_ERROR(ExpectEnd());
      node->kids = {iter, filter, body, other};
      return NodePtr(node);
    }
    if (kw == "set") {
      if (Peek().type != Tok::kName) return SyntaxError("a variable name");
      auto node = std::make_shared<Node>();
      node->line = line;
      node->name = Next().text;
      if (Accept(".")) {
        if (Peek().type != Tok::kName) return SyntaxError("an attribute name");
        node->attr = Next().text;
      }
      if (Accept("=")) {
        node->op = Op::kSet;
        ASSIGN_OR_RETURN(NodePtr value, Expression());
        node->kids.push_back(value);
        RETURN_IF_ERROR(ExpectEnd());
        return NodePtr(node);
      }
      RETURN_IF_ERROR(ExpectEnd());
      node->op = Op::kSetBlock;
      std::string end;
      ASSIGN_OR_RETURN(NodePtr body, ParseBody({"endset"}, &end));
      RETURN_IF_ERROR(ExpectEnd());
      node->kids.push_back(body);
      return NodePtr(node);
    }
    if (kw == "break" || kw == "continue") {
      RETURN_IF_ERROR(ExpectEnd());
      return Make(kw == "break" ? Op::kBreak : Op::kContinue, line);
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: renders its body
      RETURN_IF_ERROR(ExpectEnd());
      std::string end;
      ASSIGN_OR_RETURN(NodePtr body, ParseBody({"endgeneration"}, &end));
      RETURN_IF_ERROR(ExpectEnd());
      return body;
    }
    return Error(absl::StrCat("line ", line, ": unsupported tag '", kw, "'"));
  }

  // Expressions, by jinja2's precedence.
  absl::StatusOr<NodePtr> Expression() {
    if (++depth_ > kMaxDepth) return Error("nested too deeply");
    ASSIGN_OR_RETURN(NodePtr e, OrExpr());
    while (AcceptName("if")) {
      ASSIGN_OR_RETURN(NodePtr cond, OrExpr());
      NodePtr other;
      if (AcceptName("else")) {
        ASSIGN_OR_RETURN(other, OrExpr());
      }
      e = Make(Op::kCond, line_, {cond, e, other});
    }
    --depth_;
    return e;
  }

  absl::StatusOr<NodePtr> OrExpr() {
    ASSIGN_OR_RETURN(NodePtr e, AndExpr());
    while (AcceptName("or")) {
      ASSIGN_OR_RETURN(NodePtr r, AndExpr());
      e = Make(Op::kOr, line_, {e, r});
    }
    return e;
  }

  absl::StatusOr<NodePtr> AndExpr() {
    ASSIGN_OR_RETURN(NodePtr e, NotExpr());
    while (AcceptName("and")) {
      ASSIGN_OR_RETURN(NodePtr r, NotExpr());
      e = Make(Op::kAnd, line_, {e, r});
    }
    return e;
  }

  absl::StatusOr<NodePtr> NotExpr() {
    if (Peek().type == Tok::kName && Peek().text == "not") {
      ++pos_;
      if (++depth_ > kMaxDepth) return Error("nested too deeply");
      ASSIGN_OR_RETURN(NodePtr e, NotExpr());
      --depth_;
      return Make(Op::kNot, line_, {e});
    }
    return Compare();
  }

  absl::StatusOr<NodePtr> Compare() {
    ASSIGN_OR_RETURN(NodePtr e, Math1());
    for (;;) {
      std::string op;
      const Token& t = Peek();
      if (t.type == Tok::kOp &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">=")) {
        op = Next().text;
      } else if (t.type == Tok::kName && t.text == "in") {
        op = Next().text;
      } else if (t.type == Tok::kName && t.text == "not" && pos_ + 1 < toks_.size() &&
                 toks_[pos_ + 1].type == Tok::kName && toks_[pos_ + 1].text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        return e;
      }
      ASSIGN_OR_RETURN(NodePtr r, Math1());
      e = Make(Op::kCompare, line_, {e, r}, op);
    }
  }

  absl::StatusOr<NodePtr> Math1() {
    ASSIGN_OR_RETURN(NodePtr e, Concat());
    while (Peek().type == Tok::kOp && (Peek().text == "+" || Peek().text == "-")) {
      const std::string op = Next().text;
      ASSIGN_OR_RETURN(NodePtr r, Concat());
      e = Make(Op::kBinary, line_, {e, r}, op);
    }
    return e;
  }

  absl::StatusOr<NodePtr> Concat() {
    ASSIGN_OR_RETURN(NodePtr e, Math2());
    while (Accept("~")) {
      ASSIGN_OR_RETURN(NodePtr r, Math2());
      e = Make(Op::kBinary, line_, {e, r}, "~");
    }
    return e;
  }

  absl::StatusOr<NodePtr> Math2() {
    ASSIGN_OR_RETURN(NodePtr e, Pow());
    while (Peek().type == Tok::kOp &&
           (Peek().text == "*" || Peek().text == "/" || Peek().text == "//" || Peek().text == "%")) {
      const std::string op = Next().text;
      ASSIGN_OR_RETURN(NodePtr r, Pow());
      e = Make(Op::kBinary, line_, {e, r}, op);
    }
    return e;
  }

  absl::StatusOr<NodePtr> Pow() {
    ASSIGN_OR_RETURN(NodePtr e, Unary(true));
    while (Accept("**")) {
      ASSIGN_OR_RETURN(NodePtr r, Unary(true));
      e = Make(Op::kBinary, line_, {e, r}, "**");
    }
    return e;
  }

  absl::StatusOr<NodePtr> Unary(bool with_filter) {
    if (++depth_ > kMaxDepth) return Error("nested too deeply");
    NodePtr e;
    if (Accept("-")) {
      ASSIGN_OR_RETURN(NodePtr x, Unary(false));
      e = Make(Op::kNeg, line_, {x});
    } else if (Accept("+")) {
      ASSIGN_OR_RETURN(NodePtr x, Unary(false));
      e = Make(Op::kPos, line_, {x});
    } else {
      ASSIGN_OR_RETURN(e, Primary());
      ASSIGN_OR_RETURN(e, Postfix(e));
    }
    if (with_filter) {
      ASSIGN_OR_RETURN(e, FilterExpr(e));
    }
    --depth_;
    return e;
  }

  absl::StatusOr<NodePtr> Primary() {
    const Token t = Next();
    switch (t.type) {
      case Tok::kString: {
        std::string s = t.text;
        while (Peek().type == Tok::kString) s += Next().text;  // adjacent literals concatenate
        auto n = Make(Op::kLiteral, line_);
        const_cast<Node&>(*n).value = Value(std::move(s));
        return n;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        auto n = Make(Op::kLiteral, line_);
        const_cast<Node&>(*n).value = t.type == Tok::kInt ? Value(t.int_value) : Value(t.float_value);
        return n;
      }
      case Tok::kName: {
        auto n = Make(Op::kLiteral, line_);
        Value& v = const_cast<Node&>(*n).value;
        if (t.text == "true" || t.text == "True")
          v = Value(true);
        else if (t.text == "false" || t.text == "False")
          v = Value(false);
        else if (t.text == "none" || t.text == "None")
          v = Value::None();
        else
          return Make(Op::kName, line_, {}, t.text);
        return n;
      }
      case Tok::kOp:
        if (t.text == "(") {
          ASSIGN_OR_RETURN(NodePtr e, Expression());
          if (Accept(",")) {  // a tuple: a list here
            std::vector<NodePtr> items{e};
            while (!Accept(")")) {
              ASSIGN_OR_RETURN(NodePtr x, Expression());
              items.push_back(x);
              if (!Accept(",") && !(Peek().type == Tok::kOp && Peek().text == ")")) return SyntaxError("')'");
            }
            return Make(Op::kList, line_, std::move(items), "tuple");
          }
          if (!Accept(")")) return SyntaxError("')'");
          return e;
        }
        if (t.text == "[") {
          std::vector<NodePtr> items;
          while (!Accept("]")) {
            ASSIGN_OR_RETURN(NodePtr x, Expression());
            items.push_back(x);
            if (!Accept(",") && !(Peek().type == Tok::kOp && Peek().text == "]")) return SyntaxError("']'");
          }
          return Make(Op::kList, line_, std::move(items));
        }
        if (t.text == "{") {
          std::vector<NodePtr> kv;
          while (!Accept("}")) {
            ASSIGN_OR_RETURN(NodePtr k, Expression());
            if (!Accept(":")) return SyntaxError("':'");
            ASSIGN_OR_RETURN(NodePtr v, Expression());
            kv.push_back(k);
            kv.push_back(v);
            if (!Accept(",") && !(Peek().type == Tok::kOp && Peek().text == "}")) return SyntaxError("'}'");
          }
          return Make(Op::kDict, line_, std::move(kv));
        }
        break;
      default:
        break;
    }
    return Error(absl::StrCat("line ", line_, ": unexpected '", t.text, "'"));
  }

  absl::StatusOr<NodePtr> Postfix(NodePtr e) {
    for (;;) {
      if (Accept(".")) {
        if (Peek().type != Tok::kName && Peek().type != Tok::kInt) return SyntaxError("an attribute name");
        e = Make(Op::kAttr, line_, {e}, Next().text);
      } else if (Accept("[")) {
        NodePtr parts[3];
        int part = 0;
        bool slice = false;
        while (!Accept("]")) {
          if (Accept(":")) {
            if (++part > 2) return SyntaxError("']'");
            slice = true;
            continue;
          }
          if (parts[part] != nullptr) return SyntaxError("']'");
          ASSIGN_OR_RETURN(parts[part], Expression());
        }
        if (slice)
          e = Make(Op::kSlice, line_, {e, parts[0], parts[1], parts[2]});
        else if (parts[0] == nullptr)
          return SyntaxError("a subscript");
        else
          e = Make(Op::kItem, line_, {e, parts[0]});
      } else if (Peek().type == Tok::kOp && Peek().text == "(") {
        ++pos_;
        auto call = std::make_shared<Node>();
        call->op = Op::kCall;
        call->line = line_;
        call->kids.push_back(e);
        RETURN_IF_ERROR(Args(call.get()));
        e = call;
      } else {
        return e;
      }
    }
  }

  // Call arguments after "(", up to ")": positional, then name=value.
  absl::Status Args(Node* call) {
    while (!Accept(")")) {
      if (Peek().type == Tok::kName && pos_ + 1 < toks_.size() && toks_[pos_ + 1].type == Tok::kOp &&
          toks_[pos_ + 1].text == "=") {
        call->keywords.push_back(Next().text);
        ++pos_;
      } else if (!call->keywords.empty()) {
        return SyntaxError("a keyword argument");
      }
      ASSIGN_OR_RETURN(NodePtr a, Expression());
      call->kids.push_back(a);
      if (!Accept(",") && !(Peek().type == Tok::kOp && Peek().text == ")")) return SyntaxError("')'");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<NodePtr> FilterExpr(NodePtr e) {
    for (;;) {
      if (Accept("|")) {
        if (Peek().type != Tok::kName) return SyntaxError("a filter name");
        auto f = std::make_shared<Node>();
        f->op = Op::kFilter;
        f->line = line_;
        f->name = Next().text;
        f->kids.push_back(e);
        if (Accept("(")) RETURN_IF_ERROR(Args(f.get()));
        e = f;
      } else if (AcceptName("is")) {
        const bool negate = AcceptName("not");
        if (Peek().type != Tok::kName && !(Peek().type == Tok::kOp && (Peek().text == "==" || Peek().text == "!=")))
          return SyntaxError("a test name");
        auto t = std::make_shared<Node>();
        t->op = Op::kTest;
        t->line = line_;
        t->name = Next().text;
        t->kids.push_back(e);
        if (Accept("(")) {
          RETURN_IF_ERROR(Args(t.get()));
        } else if (Peek().type == Tok::kString || Peek().type == Tok::kInt || Peek().type == Tok::kFloat ||
                   (Peek().type == Tok::kName && Peek().text != "and" && Peek().text != "or" && Peek().text != "if" &&
                    Peek().text != "else" && Peek().text != "is" && Peek().text != "in" && Peek().text != "not")) {
          ASSIGN_OR_RETURN(NodePtr arg, Primary());  // `is divisibleby 3`, `is sameas none`
          ASSIGN_OR_RETURN(arg, Postfix(arg));
          t->kids.push_back(arg);
        }
        e = negate ? Make(Op::kNot, line_, {t}) : NodePtr(t);
      } else {
        return e;
      }
    }
  }

  const Token& Peek() const { return toks_[pos_]; }
  Token Next() { return toks_[pos_ < toks_.size() - 1 ? pos_++ : pos_]; }
  bool Accept(std::string_view op) {
    if (Peek().type == Tok::kOp && Peek().text == op) return ++pos_, true;
    return false;
  }
  bool AcceptName(std::string_view name) {
    if (Peek().type == Tok::kName && Peek().text == name) return ++pos_, true;
    return false;
  }
  absl::Status ExpectEnd() {
    if (Peek().type != Tok::kEnd) return SyntaxError("the end of the tag");
    return absl::OkStatus();
  }
  absl::Status SyntaxError(const std::string& expected) {
    return Error(absl::StrCat("line ", line_, ": expected ", expected, ", got '", Peek().text, "'"));
  }

  std::vector<Segment> segs_;
  size_t seg_ = 0;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  int line_ = 1;
  int depth_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Renderer

class Renderer {
 public:
  explicit Renderer(const Value& context) { scopes_.push_back(context); }

  absl::Status Exec(const Node& n, std::string* out) {
    switch (n.op) {
      case Op::kSequence:
        for (const NodePtr& k : n.kids) {
          RETURN_IF_ERROR(Exec(*k, out));
          if (control_ != Control::kNone) break;
        }
        return absl::OkStatus();
      case Op::kText:
        return Append(n.value.string_value(), out);
      case Op::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
        return Append(Str(v), out);
      }
      case Op::kIf: {
        size_t i = 0;
        for (; i + 1 < n.kids.size(); i += 2) {
          ASSIGN_OR_RETURN(Value c, Eval(*n.kids[i]));
          if (Truthy(c)) return Exec(*n.kids[i + 1], out);
        }
        if (i < n.kids.size()) return Exec(*n.kids[i], out);
        return absl::OkStatus();
      }
      case Op::kFor:
        return ExecFor(n, out);
      case Op::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
        return Assign(n, std::move(v));
      }
      case Op::kSetBlock: {
        std::string captured;
        RETURN_IF_ERROR(Exec(*n.kids[0], &captured));
        return Assign(n, Value(std::move(captured)));
      }
      case Op::kBreak:
        control_ = Control::kBreak;
        return absl::OkStatus();
      case Op::kContinue:
        control_ = Control::kContinue;
        return absl::OkStatus();
      default:
        return Error("internal: not a statement");
    }
  }

 private:
  enum class Control { kNone, kBreak, kContinue };

  absl::Status Append(std::string_view s, std::string* out) {
    if (out->size() + s.size() > kMaxOutputBytes) return Error("output too large");
    out->append(s);
    return absl::OkStatus();
  }

  absl::Status Assign(const Node& n, Value v) {
    if (n.attr.empty()) {
      scopes_.back().Set(n.name, std::move(v));
      return absl::OkStatus();
    }
    const Value target = Lookup(n.name);
    if (target.kind() != Value::Kind::kObject || !IsNamespace(target))
      return Error(absl::StrCat("line ", n.line, ": cannot set an attribute of '", n.name, "', not a namespace"));
    ASSIGN_OR_RETURN(const bool cycle, Reaches(v, target));
    if (cycle)
      return Error(
          absl::StrCat("line ", n.line, ": '", n.name, ".", n.attr, "' would hold '", n.name, "' itself (a cycle)"));
    target.Set(n.attr, std::move(v));
    return absl::OkStatus();
  }

  // Whether `object` is `v` or inside it, through lists, dicts and namespaces. Each container is
  // visited once (shared ones too) and counts as a loop iteration, so that walking a large value
  // on every assignment stays within the render's bound.
  absl::StatusOr<bool> Reaches(const Value& v, const Value& object) {
    std::vector<const Value*> pending = {&v};
    std::set<const void*> visited;
    while (!pending.empty()) {
      const Value& at = *pending.back();
      pending.pop_back();
      if (at.kind() == Value::Kind::kObject) {
        if (&at.object() == &object.object()) return true;
        if (!visited.insert(&at.object()).second) continue;
        for (const auto& [k, m] : at.object()) pending.push_back(&m);
      } else if (at.kind() == Value::Kind::kArray) {
        if (!visited.insert(&at.array()).second) continue;
        for (const Value& m : at.array()) pending.push_back(&m);
      } else {
        continue;
      }
      if (++iterations_ > kMaxIterations) return Error("too many loop iterations");
    }
    return false;
  }

  // Namespaces are objects made by namespace(); only they take attribute assignments.
  bool IsNamespace(const Value& v) const {
    return std::find_if(namespaces_.begin(), namespaces_.end(),
                        [&](const Value& n) { return &n.object() == &v.object(); }) != namespaces_.end();
  }

  Value Lookup(std::string_view name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (const Value* v = it->Find(name)) return *v;
    return Value();
  }

  absl::StatusOr<std::vector<Value>> Items(const Value& v, int line) {
    switch (v.kind()) {
      case Value::Kind::kArray:
        return v.array();
      case Value::Kind::kObject: {
        std::vector<Value> keys;
        for (const auto& [k, m] : v.object()) keys.emplace_back(k);
        return keys;
      }
      case Value::Kind::kString: {
        std::vector<Value> chars;
        for (std::string_view cp : CodePoints(v.string_value())) chars.emplace_back(std::string(cp));
        return chars;
      }
      default:
        return Error(
            absl::StrCat("line ", line, ": ", v.is_undefined() ? "an undefined value" : Repr(v), " is not iterable"));
    }
  }

  absl::Status ExecFor(const Node& n, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*n.kids[0]));
    ASSIGN_OR_RETURN(std::vector<Value> items, Items(iterable, n.line));
    auto bind = [&](const Value& item, const Value& scope) -> absl::Status {
      if (n.targets.size() == 1) {
        scope.Set(n.targets[0], item);
        return absl::OkStatus();
      }
      if (item.kind() != Value::Kind::kArray || item.array().size() != n.targets.size())
        return Error(
            absl::StrCat("line ", n.line, ": cannot unpack ", Repr(item), " into ", n.targets.size(), " names"));
      for (size_t k = 0; k < n.targets.size(); ++k) scope.Set(n.targets[k], item.array()[k]);
      return absl::OkStatus();
    };
    if (n.kids[1] != nullptr) {  // the inline filter, evaluated with the loop variables bound
      std::vector<Value> kept;
      for (const Value& item : items) {
        scopes_.push_back(Value::MakeObject());
        absl::Status s = bind(item, scopes_.back());
        absl::StatusOr<Value> c = s.ok() ? Eval(*n.kids[1]) : absl::StatusOr<Value>(s);
        scopes_.pop_back();
        if (!c.ok()) return c.status();
        if (Truthy(*c)) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return n.kids[3] != nullptr ? Exec(*n.kids[3], out) : absl::OkStatus();
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      if (++iterations_ > kMaxIterations) return Error("too many loop iterations");
      Value loop = Value::MakeObject({{"index", Value(i + 1)},
                                      {"index0", Value(i)},
                                      {"revindex", Value(len - i)},
                                      {"revindex0", Value(len - i - 1)},
                                      {"first", Value(i == 0)},
                                      {"last", Value(i == len - 1)},
                                      {"length", Value(len)},
                                      {"previtem", i > 0 ? items[i - 1] : Value()},
                                      {"nextitem", i + 1 < len ? items[i + 1] : Value()}});
      scopes_.push_back(Value::MakeObject({{"loop", loop}}));
      absl::Status s = bind(items[i], scopes_.back());
      if (s.ok()) s = Exec(*n.kids[2], out);
      scopes_.pop_back();
      RETURN_IF_ERROR(s);
      const Control c = control_;
      control_ = Control::kNone;
      if (c == Control::kBreak) break;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Value> Eval(const Node& n) {
    if (++depth_ > 4 * kMaxDepth) return Error("nested too deeply");
    absl::StatusOr<Value> v = EvalInner(n);
    --depth_;
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Node& n) {
    switch (n.op) {
      case Op::kLiteral:
        return n.value;
      case Op::kName:
        return Lookup(n.name);
      case Op::kList: {
        Value::Array items;
        for (const NodePtr& k : n.kids) {
          ASSIGN_OR_RETURN(Value v, Eval(*k));
          items.push_back(std::move(v));
        }
        return n.name == "tuple" ? Value::MakeTuple(std::move(items)) : Value::MakeArray(std::move(items));
      }
      case Op::kDict: {
        Value d = Value::MakeObject();
        for (size_t i = 0; i + 1 < n.kids.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*n.kids[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*n.kids[i + 1]));
          if (!k.is_string()) return Error(absl::StrCat("line ", n.line, ": dict keys must be strings"));
          d.Set(k.string_value(), std::move(v));
        }
        return d;
      }
      case Op::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*n.kids[0]));
        return Attribute(obj, n.name, n);
      }
      case Op::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*n.kids[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*n.kids[1]));
        return Item(obj, key, n);
      }
      case Op::kSlice:
        return Slice(n);
      case Op::kCall:
        return Call(n);
      case Op::kFilter:
        return Filter(n);
      case Op::kTest:
        return Test(n);
      case Op::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
        return Value(!Truthy(v));
      }
      case Op::kNeg:
      case Op::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
        if (!v.is_number() && v.kind() != Value::Kind::kBool) return TypeError(n, "unary -/+", v);
        if (n.op == Op::kPos) return v;
        return v.kind() == Value::Kind::kFloat ? Value(-v.float_value()) : Value(-v.int_value());
      }
      case Op::kAnd: {
        ASSIGN_OR_RETURN(Value l, Eval(*n.kids[0]));
        if (!Truthy(l)) return l;
        return Eval(*n.kids[1]);
      }
      case Op::kOr: {
        ASSIGN_OR_RETURN(Value l, Eval(*n.kids[0]));
        if (Truthy(l)) return l;
        return Eval(*n.kids[1]);
      }
      case Op::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*n.kids[0]));
        if (Truthy(c)) return Eval(*n.kids[1]);
        if (n.kids[2] == nullptr) return Value();
        return Eval(*n.kids[2]);
      }
      case Op::kBinary: {
        ASSIGN_OR_RETURN(Value l, Eval(*n.kids[0]));
        ASSIGN_OR_RETURN(Value r, Eval(*n.kids[1]));
        return Binary(n, l, r);
      }
      case Op::kCompare: {
        ASSIGN_OR_RETURN(Value l, Eval(*n.kids[0]));
        ASSIGN_OR_RETURN(Value r, Eval(*n.kids[1]));
        return Compare(n, l, r);
      }
      default:
        return Error("internal: not an expression");
    }
  }

  absl::Status TypeError(const Node& n, const std::string& what, const Value& v) {
    if (v.is_undefined()) return Error(absl::StrCat("line ", n.line, ": ", what, " of an undefined value"));
    return Error(absl::StrCat("line ", n.line, ": ", what, " is not defined for ", Repr(v)));
  }

  absl::StatusOr<Value> Attribute(const Value& obj, const std::string& name, const Node& n) {
    if (obj.is_undefined()) return Error(absl::StrCat("line ", n.line, ": '", name, "' of an undefined value"));
    if (obj.kind() == Value::Kind::kObject) {
      if (const Value* v = obj.Find(name)) return *v;
      return Value();
    }
    if (obj.kind() == Value::Kind::kArray) {
      int64_t index;
      if (std::from_chars(name.data(), name.data() + name.size(), index).ec == std::errc() && index >= 0 &&
          index < static_cast<int64_t>(obj.array().size()))
        return obj.array()[index];
    }
    return Value();
  }

  absl::StatusOr<Value> Item(const Value& obj, const Value& key, const Node& n) {
    if (obj.is_undefined()) return Error(absl::StrCat("line ", n.line, ": subscript of an undefined value"));
    if (obj.kind() == Value::Kind::kObject) {
      if (!key.is_string()) return Value();
      if (const Value* v = obj.Find(key.string_value())) return *v;
      return Value();
    }
    if ((obj.kind() == Value::Kind::kArray || obj.is_string()) &&
        (key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool)) {
      if (obj.is_string()) {
        const std::vector<std::string_view> cps = CodePoints(obj.string_value());
        int64_t i = key.int_value();
        if (i < 0) i += static_cast<int64_t>(cps.size());
        if (i < 0 || i >= static_cast<int64_t>(cps.size())) return Value();
        return Value(std::string(cps[i]));
      }
      int64_t i = key.int_value();
      if (i < 0) i += static_cast<int64_t>(obj.array().size());
      if (i < 0 || i >= static_cast<int64_t>(obj.array().size())) return Value();
      return obj.array()[i];
    }
    return Value();
  }

  absl::StatusOr<Value> Slice(const Node& n) {
    ASSIGN_OR_RETURN(Value obj, Eval(*n.kids[0]));
    std::optional<int64_t> bound[3];
    for (int k = 0; k < 3; ++k) {
      if (n.kids[k + 1] == nullptr) continue;
      ASSIGN_OR_RETURN(Value b, Eval(*n.kids[k + 1]));
      if (b.is_none()) continue;
      if (b.kind() != Value::Kind::kInt) return TypeError(n, "a slice bound", b);
      bound[k] = b.int_value();
    }
    std::vector<Value> items;
    std::vector<std::string_view> cps;
    int64_t len;
    if (obj.kind() == Value::Kind::kArray) {
      len = static_cast<int64_t>(obj.array().size());
    } else if (obj.is_string()) {
      cps = CodePoints(obj.string_value());
      len = static_cast<int64_t>(cps.size());
    } else {
      return TypeError(n, "slicing", obj);
    }
    const int64_t step = bound[2].value_or(1);
    if (step == 0) return Error(absl::StrCat("line ", n.line, ": slice step cannot be zero"));
    // Python's slice.indices.
    auto clamp = [&](std::optional<int64_t> b, int64_t dflt) {
      if (!b) return dflt;
      int64_t v = *b;
      if (v < 0) v += len;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, -1, len - 1);
    };
    const int64_t start = clamp(bound[0], step > 0 ? 0 : len - 1);
    const int64_t stop = clamp(bound[1], step > 0 ? len : -1);
    Value::Array out_items;
    std::string out_string;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.is_string())
        out_string.append(cps[i]);
      else
        out_items.push_back(obj.array()[i]);
    }
    if (obj.is_string()) return Value(std::move(out_string));
    return Value::MakeArray(std::move(out_items));
  }

  // Positional and keyword arguments of a call, filter or test (kids from `first` on).
  struct Arguments {
    std::vector<Value> positional;
    std::vector<std::pair<std::string, Value>> keyword;
    const Value* Get(size_t index, std::string_view name) const {
      if (index < positional.size()) return &positional[index];
      for (const auto& [k, v] : keyword)
        if (k == name) return &v;
      return nullptr;
    }
  };

  absl::StatusOr<Arguments> EvalArgs(const Node& n, size_t first) {
    Arguments a;
    const size_t n_keyword = n.keywords.size();
    const size_t n_args = n.kids.size() - first;
    for (size_t i = 0; i < n_args; ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*n.kids[first + i]));
      if (i + n_keyword >= n_args)
        a.keyword.emplace_back(n.keywords[i + n_keyword - n_args], std::move(v));
      else
        a.positional.push_back(std::move(v));
    }
    return a;
  }

  absl::StatusOr<Value> Call(const Node& n) {
    const Node& callee = *n.kids[0];
    ASSIGN_OR_RETURN(Arguments a, EvalArgs(n, 1));
    if (callee.op == Op::kAttr) {
      ASSIGN_OR_RETURN(Value obj, Eval(*callee.kids[0]));
      return Method(obj, callee.name, a, n);
    }
    if (callee.op != Op::kName) return Error(absl::StrCat("line ", n.line, ": not callable"));
    const std::string& f = callee.name;
    if (f == "namespace" || f == "dict") {
      Value ns = Value::MakeObject();
      if (!a.positional.empty()) {
        if (a.positional[0].kind() != Value::Kind::kObject) return TypeError(n, f, a.positional[0]);
        for (const auto& [k, v] : a.positional[0].object()) ns.Set(k, v);
      }
      for (const auto& [k, v] : a.keyword) ns.Set(k, v);
      if (f == "namespace") namespaces_.push_back(ns);
      return ns;
    }
    if (f == "range") {
      int64_t b[3] = {0, 0, 1};
      if (a.positional.empty() || a.positional.size() > 3)
        return Error(absl::StrCat("line ", n.line, ": range takes 1 to 3 arguments"));
      for (size_t i = 0; i < a.positional.size(); ++i) {
        if (a.positional[i].kind() != Value::Kind::kInt) return TypeError(n, "range", a.positional[i]);
      }
      if (a.positional.size() == 1) b[1] = a.positional[0].int_value();
      for (size_t i = 0; a.positional.size() > 1 && i < a.positional.size(); ++i) b[i] = a.positional[i].int_value();
      if (b[2] == 0) return Error(absl::StrCat("line ", n.line, ": range step cannot be zero"));
      Value::Array items;
      for (int64_t i = b[0]; b[2] > 0 ? i < b[1] : i > b[1]; i += b[2]) {
        if (items.size() >= static_cast<size_t>(kMaxIterations)) return Error("range too large");
        items.emplace_back(i);
      }
      return Value::MakeArray(std::move(items));
    }
    if (f == "raise_exception") {
      return Error(a.positional.empty() ? std::string("raise_exception") : Str(a.positional[0]));
    }
    if (f == "strftime_now") {
      if (a.positional.empty() || !a.positional[0].is_string()) return TypeError(n, "strftime_now", Value());
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t len = std::strftime(buf, sizeof buf, a.positional[0].string_value().c_str(), &tm);
      return Value(std::string(buf, len));
    }
    return Error(absl::StrCat("line ", n.line, ": unknown function '", f, "'"));
  }

  absl::StatusOr<Value> Method(const Value& obj, const std::string& name, const Arguments& a, const Node& n) {
    if (obj.is_string()) {
      const std::string& s = obj.string_value();
      auto str_arg = [&](size_t i, std::string_view kw) -> const std::string* {
        const Value* v = a.Get(i, kw);
        return v != nullptr && v->is_string() ? &v->string_value() : nullptr;
      };
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.Get(0, "prefix");
        if (p == nullptr) return TypeError(n, name, Value());
        std::vector<Value> options = p->kind() == Value::Kind::kArray ? p->array() : std::vector<Value>{*p};
        for (const Value& o : options) {
          if (!o.is_string()) return TypeError(n, name, o);
          const std::string& x = o.string_value();
          const bool hit = name == "startswith"
                               ? s.compare(0, x.size(), x) == 0
                               : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
          if (hit) return Value(true);
        }
        return Value(false);
      }
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* c = a.Get(0, "chars");
        const bool left = name != "rstrip", right = name != "lstrip";
        if (c == nullptr || c->is_none()) return Value(std::string(PyStripWhitespace(s, left, right)));
        if (!c->is_string()) return TypeError(n, name, *c);
        return Value(std::string(PyStripChars(s, c->string_value(), left, right)));
      }
      if (name == "split" || name == "rsplit") return Split(s, a, name == "rsplit", n);
      if (name == "splitlines") {
        Value::Array lines;
        size_t start = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          if (s[i] == '\n' || s[i] == '\r') {
            lines.emplace_back(s.substr(start, i - start));
            if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
            start = i + 1;
          }
        }
        if (start < s.size()) lines.emplace_back(s.substr(start));
        return Value::MakeArray(std::move(lines));
      }
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") return CaseMap(s, name);
      if (name == "replace") {
        const std::string* from = str_arg(0, "old");
        const std::string* to = str_arg(1, "new");
        if (from == nullptr || to == nullptr) return TypeError(n, name, Value());
        const Value* count = a.Get(2, "count");
        return Replace(s, *from, *to, count != nullptr && count->kind() == Value::Kind::kInt ? count->int_value() : -1);
      }
      if (name == "find" || name == "count") {
        const std::string* x = str_arg(0, "sub");
        if (x == nullptr) return TypeError(n, name, Value());
        if (name == "find") {
          const size_t at = s.find(*x);
          return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(CodePointCount(s.substr(0, at))));
        }
        if (x->empty()) return Value(static_cast<int64_t>(CodePointCount(s) + 1));
        int64_t count = 0;
        for (size_t at = s.find(*x); at != std::string::npos; at = s.find(*x, at + x->size())) ++count;
        return Value(count);
      }
      if (name == "join") {
        const Value* items = a.Get(0, "iterable");
        if (items == nullptr) return TypeError(n, name, Value());
        ASSIGN_OR_RETURN(std::vector<Value> parts, Items(*items, n.line));
        std::string out;
        for (size_t i = 0; i < parts.size(); ++i) {
          if (!parts[i].is_string()) return TypeError(n, "str.join", parts[i]);
          if (i) out += s;
          out += parts[i].string_value();
          if (out.size() > kMaxOutputBytes) return Error("string too large");
        }
        return Value(std::move(out));
      }
    }
    if (obj.kind() == Value::Kind::kObject) {
      if (name == "items" || name == "keys" || name == "values") {
        Value::Array out;
        for (const auto& [k, v] : obj.object()) {
          if (name == "items")
            out.push_back(Value::MakeTuple({Value(k), v}));
          else if (name == "keys")
            out.emplace_back(k);
          else
            out.push_back(v);
        }
        return Value::MakeArray(std::move(out));
      }
      if (name == "get") {
        const Value* k = a.Get(0, "key");
        if (k == nullptr) return TypeError(n, name, Value());
        if (k->is_string()) {
          if (const Value* v = obj.Find(k->string_value())) return *v;
        }
        const Value* d = a.Get(1, "default");
        return d != nullptr ? *d : Value::None();
      }
    }
    return Error(absl::StrCat("line ", n.line, ": ", obj.is_undefined() ? "an undefined value" : Repr(obj),
                              " has no method '", name, "'"));
  }

  absl::StatusOr<Value> Split(const std::string& s, const Arguments& a, bool from_right, const Node& n) {
    const Value* sep = a.Get(0, "sep");
    const Value* max = a.Get(1, "maxsplit");
    int64_t maxsplit = max != nullptr && max->kind() == Value::Kind::kInt ? max->int_value() : -1;
    Value::Array parts;
    if (sep == nullptr || sep->is_none()) {  // runs of whitespace; none at the ends
      std::vector<std::string> words;
      std::string_view rest = s;
      size_t n_ws;
      while (true) {
        rest = PyStripWhitespace(rest, true, false);
        if (rest.empty()) break;
        size_t i = 0;
        while (i < rest.size() && !IsPySpace(rest, i, &n_ws)) ++i;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit && !from_right) {
          words.emplace_back(PyStripWhitespace(rest, false, true));
          break;
        }
        words.emplace_back(rest.substr(0, i));
        rest.remove_prefix(i);
      }
      if (from_right && maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
        // rsplit(None, k) keeps the left part whole: rebuild it from the original text.
        const size_t keep = words.size() - maxsplit;
        std::string_view left = PyStripWhitespace(s, true, true);
        size_t cut = 0;
        std::string_view scan = left;
        for (size_t w = 0; w < keep; ++w) {
          scan = PyStripWhitespace(scan, true, false);
          const size_t at = scan.find(words[w]);
          scan.remove_prefix(at + words[w].size());
        }
        cut = left.size() - scan.size();
        std::vector<std::string> merged{std::string(left.substr(0, cut))};
        merged.insert(merged.end(), words.begin() + keep, words.end());
        words = std::move(merged);
      }
      for (std::string& w : words) parts.emplace_back(std::move(w));
      return Value::MakeArray(std::move(parts));
    }
    if (!sep->is_string()) return TypeError(n, "split", *sep);
    const std::string& d = sep->string_value();
    if (d.empty()) return Error(absl::StrCat("line ", n.line, ": empty separator"));
    std::vector<std::string> pieces;
    if (!from_right) {
      size_t start = 0;
      for (size_t at; (maxsplit < 0 || static_cast<int64_t>(pieces.size()) < maxsplit) &&
                      (at = s.find(d, start)) != std::string::npos;
           start = at + d.size())
        pieces.push_back(s.substr(start, at - start));
      pieces.push_back(s.substr(start));
    } else {
      size_t end = s.size();
      for (size_t at; (maxsplit < 0 || static_cast<int64_t>(pieces.size()) < maxsplit) && end >= d.size() &&
                      (at = s.rfind(d, end - d.size())) != std::string::npos;
           end = at)
        pieces.insert(pieces.begin(), s.substr(at + d.size(), end - at - d.size()));
      pieces.insert(pieces.begin(), s.substr(0, end));
    }
    for (std::string& p : pieces) parts.emplace_back(std::move(p));
    return Value::MakeArray(std::move(parts));
  }

  static Value CaseMap(const std::string& s, const std::string& how) {
    std::string out = s;
    bool word_start = true;
    for (size_t i = 0; i < out.size(); ++i) {
      char& c = out[i];
      const bool alpha = std::isalpha(static_cast<unsigned char>(c));
      if (how == "upper")
        c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      else if (how == "lower")
        c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      else if (how == "capitalize")
        c = static_cast<char>(i == 0 ? std::toupper(static_cast<unsigned char>(c))
                                     : std::tolower(static_cast<unsigned char>(c)));
      else
        c = static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c))
                                         : std::tolower(static_cast<unsigned char>(c)));
      word_start = !alpha;
    }
    return Value(std::move(out));
  }

  static absl::StatusOr<Value> Replace(const std::string& s, const std::string& from, const std::string& to,
                                       int64_t count) {
    std::string out;
    if (from.empty()) {  // Python inserts `to` around every character
      const std::vector<std::string_view> cps = CodePoints(s);
      int64_t done = 0;
      for (std::string_view cp : cps) {
        if (count < 0 || done < count) out += to, ++done;
        out += cp;
        if (out.size() > kMaxOutputBytes) return Error("string too large");
      }
      if (count < 0 || done < count) out += to;
      return Value(std::move(out));
    }
    size_t start = 0;
    int64_t done = 0;
    for (size_t at; (count < 0 || done < count) && (at = s.find(from, start)) != std::string::npos;
         start = at + from.size()) {
      out.append(s, start, at - start);
      out += to;
      ++done;
      if (out.size() > kMaxOutputBytes) return Error("string too large");
    }
    out.append(s, start);
    return Value(std::move(out));
  }

  absl::StatusOr<Value> Binary(const Node& n, const Value& l, const Value& r) {
    const std::string& op = n.name;
    if (op == "~") {
      std::string s = Str(l) + Str(r);
      if (s.size() > kMaxOutputBytes) return Error("string too large");
      return Value(std::move(s));
    }
    const bool ln = l.is_number() || l.kind() == Value::Kind::kBool;
    const bool rn = r.is_number() || r.kind() == Value::Kind::kBool;
    if (op == "+") {
      if (l.is_string() && r.is_string()) {
        if (l.string_value().size() + r.string_value().size() > kMaxOutputBytes) return Error("string too large");
        return Value(l.string_value() + r.string_value());
      }
      if (l.kind() == Value::Kind::kArray && r.kind() == Value::Kind::kArray) {
        Value::Array items = l.array();
        items.insert(items.end(), r.array().begin(), r.array().end());
        return Value::MakeArray(std::move(items));
      }
    }
    if (op == "*" &&
        ((l.is_string() && r.kind() == Value::Kind::kInt) || (r.is_string() && l.kind() == Value::Kind::kInt))) {
      const std::string& s = l.is_string() ? l.string_value() : r.string_value();
      const int64_t times = l.is_string() ? r.int_value() : l.int_value();
      if (times > 0 && s.size() * static_cast<uint64_t>(times) > kMaxOutputBytes) return Error("string too large");
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += s;
      return Value(std::move(out));
    }
    if (!ln || !rn)
      return Error(absl::StrCat("line ", n.line, ": unsupported operands for ", op, ": ",
                                l.is_undefined() ? "undefined" : Repr(l), " and ",
                                r.is_undefined() ? "undefined" : Repr(r)));
    const bool ints = l.kind() != Value::Kind::kFloat && r.kind() != Value::Kind::kFloat;
    const int64_t a = l.int_value(), b = r.int_value();
    const double x = l.float_value(), y = r.float_value();
    if (op == "+")
      return ints ? Value(static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b))) : Value(x + y);
    if (op == "-")
      return ints ? Value(static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b))) : Value(x - y);
    if (op == "*")
      return ints ? Value(static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b))) : Value(x * y);
    if ((op == "/" || op == "//" || op == "%") && (ints ? b == 0 : y == 0))
      return Error(absl::StrCat("line ", n.line, ": division by zero"));
    if (op == "/") return Value(x / y);
    if (op == "//") {
      if (!ints) return Value(std::floor(x / y));
      if (a == INT64_MIN && b == -1) return Value(x / y);
      int64_t q = a / b;
      if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
      return Value(q);
    }
    if (op == "%") {
      if (!ints) {
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
      if (b == -1) return Value(int64_t{0});
      int64_t m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) m += b;
      return Value(m);
    }
    if (op == "**") {
      if (ints && b >= 0) {
        int64_t result = 1;
        for (int64_t i = 0; i < b && i < 64; ++i)
          result = static_cast<int64_t>(static_cast<uint64_t>(result) * static_cast<uint64_t>(a));
        return Value(result);
      }
      return Value(std::pow(x, y));
    }
    return Error("internal: unknown operator");
  }

  absl::StatusOr<Value> Compare(const Node& n, const Value& l, const Value& r) {
    const std::string& op = n.name;
    if (op == "==") return Value(Equal(l, r));
    if (op == "!=") return Value(!Equal(l, r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) {
        if (!l.is_string()) return TypeError(n, "'in <string>'", l);
        found = r.string_value().find(l.string_value()) != std::string::npos;
      } else if (r.kind() == Value::Kind::kArray) {
        found = std::any_of(r.array().begin(), r.array().end(), [&](const Value& v) { return Equal(l, v); });
      } else if (r.kind() == Value::Kind::kObject) {
        found = l.is_string() && r.Find(l.string_value()) != nullptr;
      } else {
        return TypeError(n, "'in'", r);
      }
      return Value(op == "in" ? found : !found);
    }
    int c;
    if ((l.is_number() || l.kind() == Value::Kind::kBool) && (r.is_number() || r.kind() == Value::Kind::kBool)) {
      const double x = l.float_value(), y = r.float_value();
      if (l.kind() != Value::Kind::kFloat && r.kind() != Value::Kind::kFloat)
        c = l.int_value() < r.int_value() ? -1 : l.int_value() > r.int_value();
      else
        c = x < y ? -1 : x > y ? 1 : (x == y ? 0 : 2);  // 2: unordered (NaN)
    } else if (l.is_string() && r.is_string()) {
      c = l.string_value().compare(r.string_value());
      c = c < 0 ? -1 : c > 0;
    } else {
      return Error(absl::StrCat("line ", n.line, ": cannot compare ", l.is_undefined() ? "undefined" : Repr(l), " and ",
                                r.is_undefined() ? "undefined" : Repr(r), " with ", op));
    }
    if (c == 2) return Value(false);
    if (op == "<") return Value(c < 0);
    if (op == ">") return Value(c > 0);
    if (op == "<=") return Value(c <= 0);
    return Value(c >= 0);
  }

  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args,
                                 const Node& n) {
    using K = Value::Kind;
    const Value* arg = args.empty() ? nullptr : &args[0];
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.kind() == K::kBool;
    if (name == "true") return v.kind() == K::kBool && v.bool_value();
    if (name == "false") return v.kind() == K::kBool && !v.bool_value();
    if (name == "integer") return v.kind() == K::kInt;
    if (name == "float") return v.kind() == K::kFloat;
    if (name == "number") return v.is_number() || v.kind() == K::kBool;
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.kind() == K::kObject;
    if (name == "sequence") return v.kind() == K::kArray || v.is_string() || v.kind() == K::kObject;
    if (name == "iterable") return v.kind() == K::kArray || v.is_string() || v.kind() == K::kObject;
    if (name == "callable") return false;
    if (name == "odd" || name == "even") {
      if (v.kind() != K::kInt) return TypeError(n, name, v);
      return (v.int_value() % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
      if (v.kind() != K::kInt || arg == nullptr || arg->kind() != K::kInt || arg->int_value() == 0)
        return TypeError(n, name, v);
      return v.int_value() % arg->int_value() == 0;
    }
    if (name == "lower" || name == "upper") {
      if (!v.is_string()) return TypeError(n, name, v);
      return CaseMap(v.string_value(), name).string_value() == v.string_value();
    }
    if (arg == nullptr)
      return Error(absl::StrCat("line ", n.line, ": test '", name, "' needs an argument or is unknown"));
    if (name == "eq" || name == "equalto" || name == "==") return Equal(v, *arg);
    if (name == "ne" || name == "!=") return !Equal(v, *arg);
    if (name == "sameas") return Equal(v, *arg) && v.kind() == arg->kind();
    if (name == "in") {
      Node cmp;
      cmp.line = n.line;
      cmp.name = "in";
      ASSIGN_OR_RETURN(Value r, Compare(cmp, v, *arg));
      return r.bool_value();
    }
    for (const auto& [alias, op] : {std::pair{"lt", "<"},
                                    {"<", "<"},
                                    {"lessthan", "<"},
                                    {"gt", ">"},
                                    {">", ">"},
                                    {"greaterthan", ">"},
                                    {"le", "<="},
                                    {"<=", "<="},
                                    {"ge", ">="},
                                    {">=", ">="}}) {
      if (name == alias) {
        Node cmp;
        cmp.line = n.line;
        cmp.name = op;
        ASSIGN_OR_RETURN(Value r, Compare(cmp, v, *arg));
        return r.bool_value();
      }
    }
    return Error(absl::StrCat("line ", n.line, ": unknown test '", name, "'"));
  }

  absl::StatusOr<Value> Test(const Node& n) {
    ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
    ASSIGN_OR_RETURN(Arguments a, EvalArgs(n, 1));
    ASSIGN_OR_RETURN(bool r, ApplyTest(n.name, v, a.positional, n));
    return Value(r);
  }

  absl::StatusOr<Value> Filter(const Node& n) {
    ASSIGN_OR_RETURN(Value v, Eval(*n.kids[0]));
    ASSIGN_OR_RETURN(Arguments a, EvalArgs(n, 1));
    return ApplyFilter(n.name, v, a, n);
  }

  absl::StatusOr<Value> ApplyFilter(const std::string& f, const Value& v, const Arguments& a, const Node& n) {
    using K = Value::Kind;
    if (f == "length" || f == "count") {
      if (v.is_string()) return Value(static_cast<int64_t>(CodePointCount(v.string_value())));
      if (v.kind() == K::kArray) return Value(static_cast<int64_t>(v.array().size()));
      if (v.kind() == K::kObject) return Value(static_cast<int64_t>(v.object().size()));
      if (v.is_undefined()) return Value(int64_t{0});
      return TypeError(n, f, v);
    }
    if (f == "tojson") {
      const Value* indent = a.Get(0, "indent");
      std::string out;
      RETURN_IF_ERROR(ToJson(v,
                             indent != nullptr && indent->kind() == K::kInt
                                 ? static_cast<int>(std::clamp<int64_t>(indent->int_value(), 0, 64))
                                 : -1,
                             0, &out));
      return Value(std::move(out));
    }
    if (f == "string") return Value(Str(v));
    if (f == "safe" || f == "e" || f == "escape") {
      if (f == "safe") return v;
      std::string out;
      for (char c : Str(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value(std::move(out));
    }
    if (f == "trim") {
      const Value* chars = a.Get(0, "chars");
      const std::string s = Str(v);
      if (chars != nullptr && chars->is_string())
        return Value(std::string(PyStripChars(s, chars->string_value(), true, true)));
      return Value(std::string(PyStripWhitespace(s, true, true)));
    }
    if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") return CaseMap(Str(v), f);
    if (f == "replace") {
      const Value* from = a.Get(0, "old");
      const Value* to = a.Get(1, "new");
      if (from == nullptr || to == nullptr) return TypeError(n, f, v);
      const Value* count = a.Get(2, "count");
      return Replace(Str(v), Str(*from), Str(*to),
                     count != nullptr && count->kind() == K::kInt ? count->int_value() : -1);
    }
    if (f == "default" || f == "d") {
      const Value* dflt = a.Get(0, "default_value");
      const Value* boolean = a.Get(1, "boolean");
      const bool use = v.is_undefined() || (boolean != nullptr && Truthy(*boolean) && !Truthy(v));
      return use ? (dflt != nullptr ? *dflt : Value(std::string())) : v;
    }
    if (f == "int") {
      if (v.kind() == K::kFloat) return Value(static_cast<int64_t>(v.float_value()));
      if (v.kind() == K::kInt || v.kind() == K::kBool) return Value(v.int_value());
      if (v.is_string()) {
        int64_t x;
        const std::string_view s = PyStripWhitespace(v.string_value(), true, true);
        if (std::from_chars(s.data(), s.data() + s.size(), x).ec == std::errc()) return Value(x);
      }
      const Value* dflt = a.Get(0, "default");
      return dflt != nullptr ? *dflt : Value(int64_t{0});
    }
    if (f == "float") {
      if (v.is_number() || v.kind() == K::kBool) return Value(v.float_value());
      if (v.is_string()) {
        const std::string s(PyStripWhitespace(v.string_value(), true, true));
        char* end = nullptr;
        const double x = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) return Value(x);
      }
      const Value* dflt = a.Get(0, "default");
      return dflt != nullptr ? *dflt : Value(0.0);
    }
    if (f == "abs") {
      if (v.kind() == K::kFloat) return Value(std::fabs(v.float_value()));
      if (v.kind() == K::kInt) return Value(v.int_value() < 0 ? -v.int_value() : v.int_value());
      return TypeError(n, f, v);
    }
    if (f == "items") {
      if (v.kind() != K::kObject) return TypeError(n, f, v);
      return Method(v, "items", {}, n);
    }
    ASSIGN_OR_RETURN(std::vector<Value> items, Items(v, n.line));
    if (f == "list") return Value::MakeArray(std::move(items));
    if (f == "first" || f == "last") {
      if (items.empty()) return Value();
      return f == "first" ? items.front() : items.back();
    }
    if (f == "reverse") {
      if (v.is_string()) {
        std::string out;
        for (auto it = items.rbegin(); it != items.rend(); ++it) out += it->string_value();
        return Value(std::move(out));
      }
      std::reverse(items.begin(), items.end());
      return Value::MakeArray(std::move(items));
    }
    if (f == "join") {
      const Value* sep = a.Get(0, "d");
      const Value* attribute = a.Get(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i && sep != nullptr) out += Str(*sep);
        Value item = items[i];
        if (attribute != nullptr) {
          ASSIGN_OR_RETURN(item, Attribute(item, Str(*attribute), n));
        }
        out += Str(item);
        if (out.size() > kMaxOutputBytes) return Error("string too large");
      }
      return Value(std::move(out));
    }
    if (f == "unique") {
      Value::Array out;
      for (const Value& item : items)
        if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return Equal(o, item); })) out.push_back(item);
      return Value::MakeArray(std::move(out));
    }
    if (f == "sort") {
      const Value* reverse = a.Get(0, "reverse");
      const Value* attribute = a.Get(2, "attribute");
      std::vector<std::pair<Value, Value>> keyed;
      for (const Value& item : items) {
        Value key = item;
        if (attribute != nullptr) {
          ASSIGN_OR_RETURN(key, Attribute(item, Str(*attribute), n));
        }
        keyed.emplace_back(std::move(key), item);
      }
      absl::Status failed;
      Node cmp;
      cmp.line = n.line;
      cmp.name = "<";
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
        absl::StatusOr<Value> lt = Compare(cmp, x.first, y.first);
        if (!lt.ok()) failed = lt.status();
        return lt.ok() && lt->bool_value();
      });
      RETURN_IF_ERROR(failed);
      if (reverse != nullptr && Truthy(*reverse)) std::reverse(keyed.begin(), keyed.end());
      Value::Array out;
      for (auto& [k, item] : keyed) out.push_back(std::move(item));
      return Value::MakeArray(std::move(out));
    }
    if (f == "map") {
      Value::Array out;
      const Value* attribute = nullptr;
      for (const auto& [k, val] : a.keyword)
        if (k == "attribute") attribute = &val;
      for (const Value& item : items) {
        if (attribute != nullptr) {
          ASSIGN_OR_RETURN(Value x, Attribute(item, Str(*attribute), n));
          out.push_back(std::move(x));
        } else if (!a.positional.empty() && a.positional[0].is_string()) {
          Arguments rest;
          rest.positional.assign(a.positional.begin() + 1, a.positional.end());
          ASSIGN_OR_RETURN(Value x, ApplyFilter(a.positional[0].string_value(), item, rest, n));
          out.push_back(std::move(x));
        } else {
          return TypeError(n, f, v);
        }
      }
      return Value::MakeArray(std::move(out));
    }
    if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
      const bool by_attr = f == "selectattr" || f == "rejectattr";
      const bool keep_if = f == "select" || f == "selectattr";
      const size_t test_at = by_attr ? 1 : 0;
      if (by_attr && (a.positional.empty() || !a.positional[0].is_string())) return TypeError(n, f, v);
      Value::Array out;
      for (const Value& item : items) {
        Value x = item;
        if (by_attr) {
          ASSIGN_OR_RETURN(x, Attribute(item, a.positional[0].string_value(), n));
        }
        bool pass;
        if (a.positional.size() > test_at) {
          std::vector<Value> targs(a.positional.begin() + test_at + 1, a.positional.end());
          ASSIGN_OR_RETURN(pass, ApplyTest(Str(a.positional[test_at]), x, targs, n));
        } else {
          pass = Truthy(x);
        }
        if (pass == keep_if) out.push_back(item);
      }
      return Value::MakeArray(std::move(out));
    }
    return Error(absl::StrCat("line ", n.line, ": unknown filter '", f, "'"));
  }

  std::vector<Value> scopes_;      // globals first; one object per loop iteration
  std::vector<Value> namespaces_;  // made by namespace(): they accept attribute assignment
  Control control_ = Control::kNone;
  int64_t iterations_ = 0;
  int depth_ = 0;
};

}  // namespace

std::string PythonFloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits in scientific form: d.ddde±x.
  const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool negative = false;
  if (sci[0] == '-') {
    negative = true;
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
    absl::StrAppend(&out, "e", exp < 0 ? "-" : "+", absl::Dec(std::abs(exp), absl::kZeroPad2));
    return out;
  }
  if (exp < 0) {
    absl::StrAppend(&out, "0.", std::string(-exp - 1, '0'), digits);
    return out;
  }
  if (static_cast<int>(digits.size()) <= exp + 1) {
    absl::StrAppend(&out, digits, std::string(exp + 1 - digits.size(), '0'), ".0");
    return out;
  }
  absl::StrAppend(&out, digits.substr(0, exp + 1), ".", digits.substr(exp + 1));
  return out;
}

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Segment> segments, Split(NormalizeNewlines(source)));
  Parser parser(std::move(segments));
  ASSIGN_OR_RETURN(NodePtr root, parser.ParseAll());
  return Template(std::move(root));
}

absl::StatusOr<std::string> Template::Render(const Value& context) const {
  if (context.kind() != Value::Kind::kObject)
    return absl::InvalidArgumentError("chat template: the context must be an object");
  // The globals live in their own object, so that `set` at the top level does not write into
  // the caller's context.
  Value globals = Value::MakeObject(context.object());
  Renderer r(globals);
  std::string out;
  RETURN_IF_ERROR(r.Exec(*root_, &out));
  return out;
}

}  // namespace mer::jinja
