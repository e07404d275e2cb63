#include "common/io/fault_injecting_io_engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/check.h"
#include "common/base/status.h"

namespace mer {

absl::StatusOr<FaultInjectionOptions> ParseFaultInjectionSpec(absl::string_view spec) {
  FaultInjectionOptions o;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    double v = 0;
    if (!absl::SimpleAtod(kv.second, &v) || v < 0)
      return absl::InvalidArgumentError(absl::StrCat("fault spec: '", item, "' is not NAME=NUMBER >= 0"));
    const auto probability = [&](double* p) -> absl::Status {
      if (v > 1) return absl::InvalidArgumentError(absl::StrCat("fault spec: '", item, "': a probability is <= 1"));
      *p = v;
      return absl::OkStatus();
    };
    if (kv.first == "seed") {
      o.seed = static_cast<uint64_t>(v);
    } else if (kv.first == "eio") {
      RETURN_IF_ERROR(probability(&o.error_probability));
      o.error = EIO;
    } else if (kv.first == "short") {
      RETURN_IF_ERROR(probability(&o.short_read_probability));
    } else if (kv.first == "flip") {
      RETURN_IF_ERROR(probability(&o.bit_flip_probability));
    } else if (kv.first == "delay") {
      RETURN_IF_ERROR(probability(&o.delay_probability));
    } else if (kv.first == "delay_ms") {
      o.delay = absl::Milliseconds(v);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("fault spec: unknown '", kv.first, "' (seed, eio, short, flip, delay, delay_ms)"));
    }
  }
  return o;
}

FaultInjectingIoEngine::FaultInjectingIoEngine(std::unique_ptr<IoEngine> inner, const FaultInjectionOptions& options)
    : ChunkingIoEngine(inner->options()),
      inner_(std::move(inner)),
      faults_(options),
      rng_(options.seed),
      ops_(inner_->options().io_inflight_max) {}

absl::StatusOr<std::unique_ptr<FaultInjectingIoEngine>> FaultInjectingIoEngine::Create(
    std::unique_ptr<IoEngine> inner, const FaultInjectionOptions& options) {
  if (inner == nullptr) return absl::InvalidArgumentError("FaultInjectingIoEngine: no engine");
  RETURN_IF_ERROR(ValidateIoEngineOptions(inner->options()));
  if (inner->outstanding() != 0) {
    return absl::FailedPreconditionError("FaultInjectingIoEngine: inner engine has reads");
  }
  return std::unique_ptr<FaultInjectingIoEngine>(new FaultInjectingIoEngine(std::move(inner), options));
}

FaultInjectingIoEngine::~FaultInjectingIoEngine() { DrainForShutdown(absl::Seconds(30)); }

void FaultInjectingIoEngine::ClearFaults() {
  faults_.rules.clear();
  faults_.error_probability = 0;
  faults_.short_read_probability = 0;
  faults_.delay_probability = 0;
  faults_.bit_flip_probability = 0;
}

bool FaultInjectingIoEngine::Roll(double probability) {
  if (probability <= 0) return false;
  if (probability >= 1) return true;
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < probability;
}

void FaultInjectingIoEngine::AddFlips(uint64_t begin, uint64_t end, int count, OpState* s) {
  begin = std::max(begin, s->op.offset);
  end = std::min(end, s->op.offset + s->ask);
  if (begin >= end) return;
  for (int i = 0; i < count; ++i) {
    const uint64_t bit = std::uniform_int_distribution<uint64_t>(begin * 8, end * 8 - 1)(rng_);
    s->flips.push_back(bit);
  }
}

int FaultInjectingIoEngine::Decide(OpState* s, absl::Time now) {
  const ChunkOp& op = s->op;
  int error = 0;
  uint64_t short_bytes = 0;  // 0: none
  bool shorten = false;
  absl::Duration delay = absl::ZeroDuration();
  struct Flip {
    uint64_t begin, end;
    int count;
  };
  std::vector<Flip> flips;

  if (Roll(faults_.error_probability)) error = faults_.error;
  if (Roll(faults_.short_read_probability)) shorten = true;
  if (Roll(faults_.delay_probability)) delay = faults_.delay;
  if (Roll(faults_.bit_flip_probability)) flips.push_back({0, UINT64_MAX, 1});
  for (FaultRule& rule : faults_.rules) {
    if (rule.times == 0) continue;
    if (rule.fd >= 0 && rule.fd != op.fd) continue;
    if (op.offset >= rule.offset_end || op.offset + op.length <= rule.offset_begin) continue;
    if (!Roll(rule.probability)) continue;
    if (rule.times > 0) --rule.times;
    switch (rule.kind) {
      case FaultKind::kError:
        if (error == 0) error = rule.error;
        break;
      case FaultKind::kShortRead:
        shorten = true;
        if (rule.short_bytes > 0) short_bytes = rule.short_bytes;
        break;
      case FaultKind::kDelay:
        delay = std::max(delay, rule.delay);
        break;
      case FaultKind::kBitFlip:
        flips.push_back({rule.offset_begin, rule.offset_end, rule.bit_flips});
        break;
    }
  }

  ++stats_.reads;
  s->not_before = now + delay;
  stats_.delays += delay > absl::ZeroDuration();
  if (error != 0) {
    ++stats_.errors;
    return error;
  }
  s->ask = op.length;
  if (shorten) {
    uint64_t n = short_bytes > 0 ? short_bytes : op.length / 2;
    const uint64_t align = faults_.short_read_alignment;
    if (align > 0) n -= n % align;
    if (n > 0 && n < op.length) {
      s->ask = n;
      ++stats_.short_reads;
    }
  }
  for (const Flip& f : flips) AddFlips(f.begin, f.end, f.count, s);
  return 0;
}

absl::Status FaultInjectingIoEngine::StartOps(absl::Span<const ChunkOp> ops) {
  const absl::Time now = absl::Now();
  batch_.clear();
  for (const ChunkOp& op : ops) {
    OpState& s = ops_[op.id];
    s = OpState();
    s.op = op;
    const int error = Decide(&s, now);
    if (error != 0) {
      ChunkResult r;
      r.id = op.id;
      r.result = -error;
      held_.push_back({s.not_before, std::move(r)});
      continue;
    }
    ReadRequest q;
    q.fd = op.fd;
    q.offset = op.offset;
    q.length = s.ask;
    q.dest = op.dest;
    q.tag = op.id;
    batch_.push_back(q);
  }
  if (batch_.empty()) return absl::OkStatus();
  return inner_->Submit(batch_);
}

absl::Status FaultInjectingIoEngine::CollectInner(absl::Duration timeout) {
  inner_done_.clear();
  ASSIGN_OR_RETURN(int n, inner_->Wait(timeout > absl::ZeroDuration() ? 1 : 0, timeout, &inner_done_));
  (void)n;
  for (ReadCompletion& c : inner_done_) {
    CHECK(c.tag < ops_.size());
    OpState& s = ops_[c.tag];
    ChunkResult r;
    r.id = c.tag;
    if (!c.status.ok()) {
      r.status = std::move(c.status);
    } else {
      r.result = static_cast<int64_t>(c.bytes);
      for (uint64_t bit : s.flips) {
        s.op.dest[bit / 8 - s.op.offset] ^= static_cast<uint8_t>(1u << (bit % 8));
        ++stats_.bit_flips;
      }
    }
    held_.push_back({s.not_before, std::move(r)});
  }
  return absl::OkStatus();
}

int FaultInjectingIoEngine::ReleaseDue(std::vector<ChunkResult>* out) {
  const absl::Time now = absl::Now();
  int n = 0;
  auto due = [now](const Held& h) { return h.not_before <= now; };
  for (Held& h : held_) {
    if (due(h)) {
      out->push_back(std::move(h.result));
      ++n;
    }
  }
  held_.erase(std::remove_if(held_.begin(), held_.end(), due), held_.end());
  return n;
}

absl::Status FaultInjectingIoEngine::ReapOps(int min_results, absl::Time deadline, std::vector<ChunkResult>* out) {
  RETURN_IF_ERROR(CollectInner(absl::ZeroDuration()));
  int got = ReleaseDue(out);
  while (got < min_results) {
    const absl::Time now = absl::Now();
    if (now >= deadline) break;
    absl::Time until = deadline;
    for (const Held& h : held_) until = std::min(until, h.not_before);
    if (inner_->outstanding() > 0) {
      RETURN_IF_ERROR(CollectInner(std::max(until - now, absl::Nanoseconds(1))));
    } else if (!held_.empty()) {
      absl::SleepFor(until - now);
    } else {
      break;  // nothing issued is unaccounted for
    }
    got += ReleaseDue(out);
  }
  return absl::OkStatus();
}

}  // namespace mer
