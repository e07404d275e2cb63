#include "tools/trace/routing_trace.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer::trace {
namespace {

void PutU32(uint32_t v, std::string* out) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void PutU64(uint64_t v, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t GetU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
uint64_t GetU64(const uint8_t* p) {
  return static_cast<uint64_t>(GetU32(p)) | static_cast<uint64_t>(GetU32(p + 4)) << 32;
}

// Checks one token's top-k: ids in range and distinct. `seen` has n_expert entries, all != stamp.
template <typename Id>
absl::Status CheckRow(const Id* row, int32_t k, int32_t n_expert, std::vector<uint32_t>& seen, uint32_t stamp,
                      const char* where_kind, int64_t where) {
  for (int32_t j = 0; j < k; ++j) {
    const int64_t e = static_cast<int64_t>(row[j]);
    if (e < 0 || e >= n_expert)
      return absl::InvalidArgumentError(
          absl::StrCat(where_kind, " ", where, ": expert id ", e, " outside [0, ", n_expert, ")"));
    if (seen[e] == stamp)
      return absl::InvalidArgumentError(
          absl::StrCat(where_kind, " ", where, ": expert ", e, " chosen twice by one token"));
    seen[e] = stamp;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTraceGeometry(const TraceGeometry& g) {
  if (g.n_layer < 1 || g.n_layer > kTraceMaxLayers)
    return absl::InvalidArgumentError(absl::StrCat("n_layer ", g.n_layer, " outside [1, ", kTraceMaxLayers, "]"));
  if (g.n_expert < 1 || g.n_expert > kTraceMaxExperts)
    return absl::InvalidArgumentError(absl::StrCat("n_expert ", g.n_expert, " outside [1, ", kTraceMaxExperts, "]"));
  if (g.top_k < 1 || g.top_k > kTraceMaxTopK || g.top_k > g.n_expert)
    return absl::InvalidArgumentError(
        absl::StrCat("top_k ", g.top_k, " outside [1, min(n_expert, ", kTraceMaxTopK, ")]"));
  if (g.expert_bytes < 0 || g.expert_bytes > kTraceMaxExpertBytes)
    return absl::InvalidArgumentError(absl::StrCat("expert_bytes ", g.expert_bytes, " out of range"));
  return absl::OkStatus();
}

absl::Status RoutingTrace::AddRecord(TracePhase phase, int32_t n_tokens, absl::Span<const int32_t> ids) {
  RETURN_IF_ERROR(ValidateTraceGeometry(geometry_));
  if (phase != TracePhase::kPrompt && phase != TracePhase::kDecode)
    return absl::InvalidArgumentError("unknown record phase");
  if (n_tokens < 1 || n_tokens > kTraceMaxRecordTokens)
    return absl::InvalidArgumentError(absl::StrCat("record of ", n_tokens, " tokens"));
  const size_t want = static_cast<size_t>(geometry_.n_layer) * n_tokens * geometry_.top_k;
  if (ids.size() != want)
    return absl::InvalidArgumentError(absl::StrCat("record has ", ids.size(), " ids, want ", want));
  std::vector<uint32_t> seen(geometry_.n_expert, 0);
  const int64_t index = static_cast<int64_t>(records_.size());
  for (size_t row = 0; row < want / geometry_.top_k; ++row)
    RETURN_IF_ERROR(CheckRow(ids.data() + row * geometry_.top_k, geometry_.top_k, geometry_.n_expert, seen,
                             static_cast<uint32_t>(row + 1), "record", index));
  records_.push_back({phase, n_tokens, static_cast<int64_t>(ids_.size())});
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  tokens_ += n_tokens;
  if (phase == TracePhase::kDecode) decode_tokens_ += n_tokens;
  return absl::OkStatus();
}

std::string EncodeTraceHeader(const TraceGeometry& g, uint64_t n_records) {
  std::string out(kTraceMagic, sizeof(kTraceMagic));
  PutU32(kTraceVersion, &out);
  PutU32(kTraceHeaderBytes, &out);
  PutU32(static_cast<uint32_t>(g.n_layer), &out);
  PutU32(static_cast<uint32_t>(g.n_expert), &out);
  PutU32(static_cast<uint32_t>(g.top_k), &out);
  PutU32(0, &out);  // flags
  PutU64(static_cast<uint64_t>(g.expert_bytes), &out);
  PutU64(n_records, &out);
  return out;
}

void AppendTraceRecord(TracePhase phase, int32_t n_tokens, absl::Span<const int32_t> ids, std::string* out) {
  PutU32(static_cast<uint32_t>(phase), out);
  PutU32(static_cast<uint32_t>(n_tokens), out);
  const size_t at = out->size();
  out->resize(at + 2 * ids.size());
  char* p = out->data() + at;
  for (int32_t id : ids) {
    *p++ = static_cast<char>(id & 0xFF);
    *p++ = static_cast<char>((id >> 8) & 0xFF);
  }
}

std::string EncodeTrace(const RoutingTrace& trace) {
  const TraceGeometry& g = trace.geometry();
  std::string out = EncodeTraceHeader(g, trace.records().size());
  std::vector<int32_t> ids;
  for (size_t r = 0; r < trace.records().size(); ++r) {
    ids.clear();
    for (int l = 0; l < g.n_layer; ++l) {
      absl::Span<const uint16_t> e = trace.Experts(r, l);
      ids.insert(ids.end(), e.begin(), e.end());
    }
    AppendTraceRecord(trace.records()[r].phase, trace.records()[r].n_tokens, ids, &out);
  }
  return out;
}

absl::StatusOr<RoutingTrace> ParseTrace(absl::Span<const uint8_t> bytes) {
  if (bytes.size() < kTraceHeaderBytes)
    return absl::DataLossError(absl::StrCat("routing trace of ", bytes.size(), " bytes is shorter than its header"));
  const uint8_t* h = bytes.data();
  if (std::memcmp(h, kTraceMagic, sizeof(kTraceMagic)) != 0)
    return absl::InvalidArgumentError("not a routing trace (bad magic)");
  const uint32_t version = GetU32(h + 8);
  if (version != kTraceVersion)
    return absl::InvalidArgumentError(
        absl::StrCat("routing trace version ", version, " is not supported (this build reads ", kTraceVersion, ")"));
  if (GetU32(h + 12) != kTraceHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat("header size ", GetU32(h + 12), ", want ", kTraceHeaderBytes));
  const uint32_t n_layer = GetU32(h + 16), n_expert = GetU32(h + 20), top_k = GetU32(h + 24);
  if (GetU32(h + 28) != 0) return absl::InvalidArgumentError("unknown header flags");
  const uint64_t expert_bytes = GetU64(h + 32);
  const uint64_t n_records = GetU64(h + 40);
  if (n_layer > static_cast<uint32_t>(kTraceMaxLayers) || n_expert > static_cast<uint32_t>(kTraceMaxExperts) ||
      top_k > static_cast<uint32_t>(kTraceMaxTopK) || expert_bytes > static_cast<uint64_t>(kTraceMaxExpertBytes))
    return absl::InvalidArgumentError("geometry out of range");
  TraceGeometry g{static_cast<int32_t>(n_layer), static_cast<int32_t>(n_expert), static_cast<int32_t>(top_k),
                  static_cast<int64_t>(expert_bytes)};
  RETURN_IF_ERROR(ValidateTraceGeometry(g));

  const size_t body = bytes.size() - kTraceHeaderBytes;
  const uint64_t min_record = kTraceRecordHeaderBytes + uint64_t{2} * n_layer * top_k;
  if (n_records > body / min_record)
    return absl::DataLossError(
        absl::StrCat("header announces ", n_records, " records; ", body, " bytes hold at most ", body / min_record));
  RoutingTrace trace(g);
  trace.records_.reserve(n_records);
  trace.ids_.reserve(body / 2);
  std::vector<uint32_t> seen(n_expert, 0);
  uint32_t stamp = 0;
  size_t at = kTraceHeaderBytes;
  for (uint64_t r = 0; r < n_records; ++r) {
    if (bytes.size() - at < kTraceRecordHeaderBytes)
      return absl::DataLossError(absl::StrCat("record ", r, ": truncated header"));
    const uint32_t phase = GetU32(h + at), n_tokens = GetU32(h + at + 4);
    at += kTraceRecordHeaderBytes;
    if (phase != static_cast<uint32_t>(TracePhase::kPrompt) && phase != static_cast<uint32_t>(TracePhase::kDecode))
      return absl::InvalidArgumentError(absl::StrCat("record ", r, ": unknown phase ", phase));
    if (n_tokens < 1 || n_tokens > static_cast<uint32_t>(kTraceMaxRecordTokens))
      return absl::InvalidArgumentError(absl::StrCat("record ", r, ": ", n_tokens, " tokens"));
    const uint64_t n_ids = uint64_t{n_layer} * n_tokens * top_k;  // < 2^56
    if ((bytes.size() - at) / 2 < n_ids)
      return absl::DataLossError(absl::StrCat("record ", r, ": truncated (", n_ids, " ids announced)"));
    const int64_t offset = static_cast<int64_t>(trace.ids_.size());
    for (uint64_t row = 0; row < n_ids / top_k; ++row) {
      uint16_t ids[kTraceMaxTopK];
      for (uint32_t j = 0; j < top_k; ++j) {
        ids[j] = static_cast<uint16_t>(h[at] | h[at + 1] << 8);
        at += 2;
      }
      if (++stamp == 0) {  // wrapped: clear the marks
        std::fill(seen.begin(), seen.end(), 0);
        stamp = 1;
      }
      RETURN_IF_ERROR(CheckRow(ids, g.top_k, g.n_expert, seen, stamp, "record", static_cast<int64_t>(r)));
      trace.ids_.insert(trace.ids_.end(), ids, ids + top_k);
    }
    const TracePhase ph = static_cast<TracePhase>(phase);
    trace.records_.push_back({ph, static_cast<int32_t>(n_tokens), offset});
    trace.tokens_ += n_tokens;
    if (ph == TracePhase::kDecode) trace.decode_tokens_ += n_tokens;
  }
  if (at != bytes.size())
    return absl::InvalidArgumentError(
        absl::StrCat(bytes.size() - at, " bytes after the last of ", n_records, " records"));
  return trace;
}

absl::StatusOr<RoutingTrace> ReadTraceFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::DataLossError(absl::StrCat("reading ", path, " failed"));
  auto trace = ParseTrace(bytes);
  if (!trace.ok()) return absl::Status(trace.status().code(), absl::StrCat(path, ": ", trace.status().message()));
  return trace;
}

absl::Status WriteTraceFile(const RoutingTrace& trace, const std::string& path) {
  const std::string bytes = EncodeTrace(trace);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("cannot create ", path));
  const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  if (std::fclose(f) != 0 || written != bytes.size())
    return absl::UnavailableError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace mer::trace
