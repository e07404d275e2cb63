// Records a routing trace from the engine: a RoutingObserver (services/compute/backend.h) that
// turns each Forward call (layers 0..n_layer-1, one OnRouting each) into one record, prompt
// chunks and decode steps alike, in the order they run.
//
// A record is a prompt record or a decode record by set_phase(); in kAuto (the default) a batch of
// one token is a decode step and a larger one a prompt chunk. RecordGeneration (what `mer trace
// record` runs) sets kPrompt before generation and kDecode once the first token is sampled, so a
// one-token prompt is recorded right.
//
// OnRouting cannot return an error; the first one (routing that does not match the geometry,
// a write failure) is kept, later calls are ignored, and Finish() returns it. Finish writes the
// record count into the header and closes the file; a file not finished reads as corrupt.
//
// Thread-safety: one engine, one thread (OnRouting is called on the engine's calling thread).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/compute/backend.h"
#include "services/compute/generation.h"
#include "tools/trace/routing_trace.h"

namespace mer::trace {

class TraceWriter final : public RoutingObserver {
 public:
  enum class Phase { kAuto, kPrompt, kDecode };

  // Writes to `path` (created or truncated).
  static absl::StatusOr<std::unique_ptr<TraceWriter>> Create(const std::string& path, const TraceGeometry& geometry);
  // Keeps the bytes in memory (bytes() after Finish).
  static absl::StatusOr<std::unique_ptr<TraceWriter>> CreateInMemory(const TraceGeometry& geometry);
  ~TraceWriter() override;

  void set_phase(Phase phase) { phase_ = phase; }
  void OnRouting(int layer, absl::Span<const int32_t> experts_per_token, int k) override;

  // The first error so far (OK if none).
  const absl::Status& status() const { return status_; }
  // Completes the file. Also an error if a batch stopped between layers.
  absl::Status Finish();

  int64_t records() const { return records_; }
  int64_t tokens() const { return tokens_; }
  int64_t decode_tokens() const { return decode_tokens_; }
  const std::string& bytes() const { return buffer_; }  // in-memory writers

 private:
  TraceWriter(const TraceGeometry& geometry, std::FILE* file);
  void Fail(absl::Status status);
  absl::Status Flush();

  const TraceGeometry geometry_;
  std::FILE* file_ = nullptr;  // null: in memory
  Phase phase_ = Phase::kAuto;
  absl::Status status_;
  bool finished_ = false;
  int next_layer_ = 0;          // the layer the next OnRouting must be
  int32_t batch_tokens_ = 0;    // tokens of the batch in progress
  std::vector<int32_t> batch_;  // its ids, [layer][token][k]
  std::string buffer_;          // encoded bytes not yet written (all of them in memory)
  int64_t records_ = 0;
  int64_t tokens_ = 0;
  int64_t decode_tokens_ = 0;
};

// Generate (services/compute/generation.h) with `writer` as the backend's routing observer: the
// prompt's batches recorded as prompt records, every later batch as a decode step. The observer is
// removed before it returns; the writer is left to be finished. Returns what Generate returns (the
// writer's own errors: writer.status()).
absl::StatusOr<std::vector<int32_t>> RecordGeneration(ComputeBackend& backend, int sequence,
                                                      const GenerationRequest& request, TraceWriter& writer,
                                                      GenerationStats* stats = nullptr);

}  // namespace mer::trace
