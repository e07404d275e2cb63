// Routing traces: which experts every token chose at every layer, as recorded from the engine
// (trace_writer.h) and replayed against cache policies (replay.h). The file format is specified in
// docs/routing_trace.md: a 48-byte little-endian header (magic "MERTRACE", version, geometry,
// expert size, record count) followed by records, one per engine batch (a prompt chunk or a decode
// step), each holding uint16 expert ids [n_layer][n_tokens][top_k].
//
// ParseTrace validates everything (it reads untrusted files and is fuzzed): sizes, counts, ranges,
// distinct ids within each token's top-k, and that the bytes end exactly after the last record.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mer::trace {

inline constexpr char kTraceMagic[8] = {'M', 'E', 'R', 'T', 'R', 'A', 'C', 'E'};
inline constexpr uint32_t kTraceVersion = 1;
inline constexpr uint32_t kTraceHeaderBytes = 48;
inline constexpr uint32_t kTraceRecordHeaderBytes = 8;
inline constexpr int32_t kTraceMaxLayers = 65536;
inline constexpr int32_t kTraceMaxExperts = 65536;
inline constexpr int32_t kTraceMaxTopK = 256;
inline constexpr int32_t kTraceMaxRecordTokens = 1 << 24;
inline constexpr int64_t kTraceMaxExpertBytes = int64_t{1} << 40;

struct TraceGeometry {
  int32_t n_layer = 0;
  int32_t n_expert = 0;
  int32_t top_k = 0;
  int64_t expert_bytes = 0;  // bytes of one expert (gate + up + down); 0 = unknown
};

// InvalidArgument naming the field when outside the limits above (top_k <= n_expert).
absl::Status ValidateTraceGeometry(const TraceGeometry& g);

// What produced a record. Values are the on-disk codes.
enum class TracePhase : uint32_t { kPrompt = 1, kDecode = 2 };

class RoutingTrace {
 public:
  struct Record {
    TracePhase phase = TracePhase::kDecode;
    int32_t n_tokens = 0;
    int64_t offset = 0;  // into the id array, of layer 0's [n_tokens, top_k]
  };

  RoutingTrace() = default;
  explicit RoutingTrace(const TraceGeometry& geometry) : geometry_(geometry) {}

  const TraceGeometry& geometry() const { return geometry_; }
  void set_expert_bytes(int64_t bytes) { geometry_.expert_bytes = bytes; }
  const std::vector<Record>& records() const { return records_; }
  int64_t tokens() const { return tokens_; }
  int64_t decode_tokens() const { return decode_tokens_; }
  int64_t prompt_tokens() const { return tokens_ - decode_tokens_; }

  // Record r's ids at `layer`: [n_tokens, top_k] row-major.
  absl::Span<const uint16_t> Experts(size_t record, int layer) const {
    const Record& rec = records_[record];
    const size_t n = static_cast<size_t>(rec.n_tokens) * geometry_.top_k;
    return absl::MakeConstSpan(ids_.data() + rec.offset + n * layer, n);
  }

  // Appends a record of ids [n_layer][n_tokens][top_k] (validated like a parsed one).
  absl::Status AddRecord(TracePhase phase, int32_t n_tokens, absl::Span<const int32_t> ids);

 private:
  friend absl::StatusOr<RoutingTrace> ParseTrace(absl::Span<const uint8_t> bytes);
  TraceGeometry geometry_;
  std::vector<Record> records_;
  std::vector<uint16_t> ids_;
  int64_t tokens_ = 0;
  int64_t decode_tokens_ = 0;
};

// The 48-byte header for `n_records` records (the writer patches the count at the end).
std::string EncodeTraceHeader(const TraceGeometry& g, uint64_t n_records);
// One record's bytes; ids are [n_layer][n_tokens][top_k], not validated here.
void AppendTraceRecord(TracePhase phase, int32_t n_tokens, absl::Span<const int32_t> ids, std::string* out);
// The whole file.
std::string EncodeTrace(const RoutingTrace& trace);

// InvalidArgument (DataLoss for a truncated file) naming what is wrong and where.
absl::StatusOr<RoutingTrace> ParseTrace(absl::Span<const uint8_t> bytes);
absl::StatusOr<RoutingTrace> ReadTraceFile(const std::string& path);
absl::Status WriteTraceFile(const RoutingTrace& trace, const std::string& path);

}  // namespace mer::trace
