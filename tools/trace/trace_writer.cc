#include "tools/trace/trace_writer.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace mer::trace {
namespace {
constexpr size_t kFlushBytes = 1 << 20;
}  // namespace

TraceWriter::TraceWriter(const TraceGeometry& geometry, std::FILE* file) : geometry_(geometry), file_(file) {
  buffer_ = EncodeTraceHeader(geometry_, 0);
}

TraceWriter::~TraceWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& path,
                                                                 const TraceGeometry& geometry) {
  RETURN_IF_ERROR(ValidateTraceGeometry(geometry));
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("cannot create ", path));
  return std::unique_ptr<TraceWriter>(new TraceWriter(geometry, f));
}

absl::StatusOr<std::unique_ptr<TraceWriter>> TraceWriter::CreateInMemory(const TraceGeometry& geometry) {
  RETURN_IF_ERROR(ValidateTraceGeometry(geometry));
  return std::unique_ptr<TraceWriter>(new TraceWriter(geometry, nullptr));
}

void TraceWriter::Fail(absl::Status status) {
  if (status_.ok()) status_ = std::move(status);
}

absl::Status TraceWriter::Flush() {
  if (file_ == nullptr || buffer_.empty()) return absl::OkStatus();
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size())
    return absl::UnavailableError("writing the routing trace failed");
  buffer_.clear();
  return absl::OkStatus();
}

void TraceWriter::OnRouting(int layer, absl::Span<const int32_t> experts, int k) {
  if (!status_.ok() || finished_) return;
  if (k != geometry_.top_k)
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("routing with k = ", k, ", trace has top_k ", geometry_.top_k)));
  if (layer != next_layer_)
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("routing of layer ", layer, " where layer ", next_layer_, " was due")));
  if (experts.empty() || experts.size() % k != 0)
    return Fail(absl::InvalidArgumentError(absl::StrCat("routing of ", experts.size(), " ids is not whole tokens")));
  const int32_t n_tokens = static_cast<int32_t>(experts.size() / k);
  if (layer == 0) {
    batch_tokens_ = n_tokens;
    batch_.clear();
  } else if (n_tokens != batch_tokens_) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " routed ", n_tokens, " tokens, layer 0 ", batch_tokens_)));
  }
  for (int32_t e : experts) {
    if (e < 0 || e >= geometry_.n_expert)
      return Fail(
          absl::InvalidArgumentError(absl::StrCat("expert id ", e, " outside the trace's ", geometry_.n_expert)));
  }
  for (size_t t = 0; t < experts.size(); t += k) {
    for (int i = 1; i < k; ++i)
      for (int j = 0; j < i; ++j)
        if (experts[t + i] == experts[t + j])
          return Fail(
              absl::InvalidArgumentError(absl::StrCat("expert ", experts[t + i], " chosen twice by one token")));
  }
  batch_.insert(batch_.end(), experts.begin(), experts.end());
  next_layer_ = layer + 1;
  if (next_layer_ < geometry_.n_layer) return;

  next_layer_ = 0;
  const TracePhase phase = phase_ == Phase::kPrompt   ? TracePhase::kPrompt
                           : phase_ == Phase::kDecode ? TracePhase::kDecode
                           : n_tokens == 1            ? TracePhase::kDecode
                                                      : TracePhase::kPrompt;
  AppendTraceRecord(phase, n_tokens, batch_, &buffer_);
  ++records_;
  tokens_ += n_tokens;
  if (phase == TracePhase::kDecode) decode_tokens_ += n_tokens;
  if (buffer_.size() >= kFlushBytes) {
    if (absl::Status s = Flush(); !s.ok()) Fail(std::move(s));
  }
}

absl::Status TraceWriter::Finish() {
  if (finished_) return status_;
  finished_ = true;
  if (status_.ok() && next_layer_ != 0)
    Fail(absl::FailedPreconditionError(absl::StrCat("the last batch stopped after layer ", next_layer_ - 1)));
  const std::string header = EncodeTraceHeader(geometry_, static_cast<uint64_t>(records_));
  if (file_ == nullptr) {
    buffer_.replace(0, header.size(), header);
    return status_;
  }
  if (status_.ok()) {
    if (absl::Status s = Flush(); !s.ok()) Fail(std::move(s));
  }
  if (status_.ok() &&
      (std::fseek(file_, 0, SEEK_SET) != 0 || std::fwrite(header.data(), 1, header.size(), file_) != header.size()))
    Fail(absl::UnavailableError("writing the routing trace header failed"));
  if (std::fclose(file_) != 0) Fail(absl::UnavailableError("closing the routing trace failed"));
  file_ = nullptr;
  return status_;
}

absl::StatusOr<std::vector<int32_t>> RecordGeneration(ComputeBackend& backend, int sequence,
                                                      const GenerationRequest& request, TraceWriter& writer,
                                                      GenerationStats* stats) {
  writer.set_phase(TraceWriter::Phase::kPrompt);
  backend.set_routing_observer(&writer);
  auto out = Generate(
      backend, sequence, request, [&](int32_t) { writer.set_phase(TraceWriter::Phase::kDecode); }, stats);
  backend.set_routing_observer(nullptr);
  return out;
}

}  // namespace mer::trace
