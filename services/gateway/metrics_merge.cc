#include "services/gateway/metrics_merge.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace mer::gateway {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

absl::StatusOr<MetricType> ParseType(absl::string_view t) {
  if (t == "counter") return MetricType::Counter;
  if (t == "gauge") return MetricType::Gauge;
  if (t == "histogram") return MetricType::Histogram;
  if (t == "summary") return MetricType::Summary;
  if (t == "untyped") return MetricType::Untyped;
  return absl::InvalidArgumentError(absl::StrCat("unknown metric type '", t, "'"));
}

bool ParseValue(absl::string_view s, double* v) {
  if (s == "+Inf" || s == "Inf") {
    *v = std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "-Inf") {
    *v = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (s == "NaN") {
    *v = std::nan("");
    return true;
  }
  return absl::SimpleAtod(s, v);
}

bool IsMetricName(absl::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsLabelName(absl::string_view n) { return IsMetricName(n) && n.find(':') == absl::string_view::npos; }

// A count of a histogram or summary: non-negative and representable, else 0.
uint64_t Count(double v) {
  if (!(v >= 0)) return 0;
  if (v >= 1.8e19) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(v);
}

struct Sample {
  std::string name;
  std::vector<ClientMetric::Label> labels;
  double value = 0;
};

absl::StatusOr<Sample> ParseSample(absl::string_view line) {
  Sample s;
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  s.name = std::string(line.substr(0, i));
  if (!IsMetricName(s.name)) return absl::InvalidArgumentError(absl::StrCat("bad metric name in '", line, "'"));
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t eq = line.find('=', i);
      if (eq == absl::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"')
        return absl::InvalidArgumentError(absl::StrCat("bad labels in '", line, "'"));
      ClientMetric::Label l;
      l.name = std::string(line.substr(i, eq - i));
      if (!IsLabelName(l.name)) return absl::InvalidArgumentError(absl::StrCat("bad label name in '", line, "'"));
      size_t j = eq + 2;
      for (; j < line.size() && line[j] != '"'; ++j) {
        if (line[j] == '\\' && j + 1 < line.size()) {
          ++j;
          l.value.push_back(line[j] == 'n' ? '\n' : line[j]);
        } else {
          l.value.push_back(line[j]);
        }
      }
      if (j >= line.size()) return absl::InvalidArgumentError(absl::StrCat("unterminated label in '", line, "'"));
      s.labels.push_back(std::move(l));
      i = j + 1;
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return absl::InvalidArgumentError(absl::StrCat("unterminated labels in '", line, "'"));
    ++i;
  }
  while (i < line.size() && line[i] == ' ') ++i;
  const absl::string_view rest = line.substr(i);
  const absl::string_view value = rest.substr(0, rest.find(' '));  // a timestamp may follow
  if (!ParseValue(value, &s.value)) return absl::InvalidArgumentError(absl::StrCat("bad value in '", line, "'"));
  return s;
}

std::string LabelKey(const std::vector<ClientMetric::Label>& labels) {
  std::string key;
  for (const auto& l : labels) {
    if (l.name == "le" || l.name == "quantile") continue;
    absl::StrAppend(&key, l.name, "\x1f", l.value, "\x1e");
  }
  return key;
}

// Adds a sample to the family it belongs to (histogram and summary parts are grouped into one
// ClientMetric per label set).
void AddSample(MetricFamily* f, std::map<std::string, size_t>* groups, Sample s) {
  if (f->type != MetricType::Histogram && f->type != MetricType::Summary) {
    ClientMetric m;
    m.label = std::move(s.labels);
    if (f->type == MetricType::Counter)
      m.counter.value = s.value;
    else if (f->type == MetricType::Gauge)
      m.gauge.value = s.value;
    else
      m.untyped.value = s.value;
    f->metric.push_back(std::move(m));
    return;
  }
  const std::string key = LabelKey(s.labels);
  auto it = groups->find(key);
  if (it == groups->end()) {
    ClientMetric m;
    for (auto& l : s.labels)
      if (l.name != "le" && l.name != "quantile") m.label.push_back(l);
    f->metric.push_back(std::move(m));
    it = groups->emplace(key, f->metric.size() - 1).first;
  }
  ClientMetric& m = f->metric[it->second];
  const std::string suffix = s.name.substr(std::min(s.name.size(), f->name.size()));
  auto label = [&](const char* name) -> std::string {
    for (const auto& l : s.labels)
      if (l.name == name) return l.value;
    return "";
  };
  if (f->type == MetricType::Histogram) {
    if (suffix == "_bucket") {
      double le = 0;
      ParseValue(label("le"), &le);
      m.histogram.bucket.push_back({Count(s.value), le});
    } else if (suffix == "_sum") {
      m.histogram.sample_sum = s.value;
    } else if (suffix == "_count") {
      m.histogram.sample_count = Count(s.value);
    }
  } else {
    if (suffix == "_sum") {
      m.summary.sample_sum = s.value;
    } else if (suffix == "_count") {
      m.summary.sample_count = Count(s.value);
    } else {
      double q = 0;
      ParseValue(label("quantile"), &q);
      m.summary.quantile.push_back({q, s.value});
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<MetricFamily>> ParseMetricsText(absl::string_view text) {
  std::vector<MetricFamily> out;
  std::map<std::string, size_t> groups;
  std::string pending_help_name, pending_help;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (absl::StartsWith(line, "# HELP ")) {
      const absl::string_view rest = line.substr(7);
      const size_t sp = rest.find(' ');
      pending_help_name = std::string(rest.substr(0, sp));
      // Kept as written (escaped): prometheus-cpp's serializer writes help text as is.
      pending_help = sp == absl::string_view::npos ? "" : std::string(rest.substr(sp + 1));
      continue;
    }
    if (absl::StartsWith(line, "# TYPE ")) {
      std::vector<absl::string_view> parts = absl::StrSplit(line.substr(7), ' ');
      if (parts.size() != 2) return absl::InvalidArgumentError(absl::StrCat("bad line '", line, "'"));
      MetricFamily f;
      f.name = std::string(parts[0]);
      if (!IsMetricName(f.name)) return absl::InvalidArgumentError(absl::StrCat("bad metric name in '", line, "'"));
      auto type = ParseType(parts[1]);
      if (!type.ok()) return type.status();
      f.type = *type;
      if (pending_help_name == f.name) f.help = pending_help;
      out.push_back(std::move(f));
      groups.clear();
      continue;
    }
    if (line[0] == '#') continue;
    auto sample = ParseSample(line);
    if (!sample.ok()) return sample.status();
    if (out.empty() || !absl::StartsWith(sample->name, out.back().name)) {
      // A sample without a TYPE line: an untyped family of its own.
      MetricFamily f;
      f.name = sample->name;
      f.type = MetricType::Untyped;
      out.push_back(std::move(f));
      groups.clear();
    }
    AddSample(&out.back(), &groups, std::move(*sample));
  }
  return out;
}

void AddLabel(std::vector<MetricFamily>* families, const std::string& name, const std::string& value) {
  for (auto& f : *families) {
    for (auto& m : f.metric) {
      bool has = false;
      for (const auto& l : m.label) has |= l.name == name;
      if (!has) m.label.insert(m.label.begin(), ClientMetric::Label{name, value});
    }
  }
}

void MergeFamilies(std::vector<MetricFamily>* into, std::vector<MetricFamily> more) {
  for (auto& f : more) {
    auto it = std::find_if(into->begin(), into->end(), [&](const MetricFamily& g) { return g.name == f.name; });
    if (it == into->end()) {
      into->push_back(std::move(f));
    } else if (it->type == f.type) {
      for (auto& m : f.metric) it->metric.push_back(std::move(m));
    }
  }
}

absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout) {
  if (!absl::StartsWith(url, "http://")) return absl::InvalidArgumentError(absl::StrCat("not an http:// URL: ", url));
  const std::string rest = url.substr(7);
  const size_t slash = rest.find('/');
  const std::string hostport = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "/" : rest.substr(slash);
  const size_t colon = hostport.rfind(':');
  const std::string host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  const std::string port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr)
    return absl::UnavailableError(absl::StrCat("cannot resolve ", hostport));
  const absl::Time deadline = absl::Now() + timeout;
  int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return absl::UnavailableError("socket failed");
  }
  auto wait = [&](short events) {
    const int ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    pollfd p{fd, events, 0};
    return poll(&p, 1, ms) == 1;
  };
  const int rc = connect(fd, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  int err = 0;
  socklen_t len = sizeof(err);
  if ((rc != 0 && (errno != EINPROGRESS || !wait(POLLOUT))) || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
      err != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot connect to ", hostport));
  }
  const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", hostport, "\r\n\r\n");
  size_t sent = 0;
  while (sent < request.size()) {
    if (!wait(POLLOUT)) break;
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  std::string response;
  char buf[16384];
  while (sent == request.size() && wait(POLLIN)) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    response.append(buf, n);
    if (response.size() > (64u << 20)) break;
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos || !absl::StartsWith(response, "HTTP/1.") || response.size() < 12 ||
      response.compare(9, 3, "200") != 0)
    return absl::UnavailableError(absl::StrCat("GET ", url, ": no 200 answer"));
  return response.substr(body + 4);
}

}  // namespace mer::gateway
