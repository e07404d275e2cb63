// The check every backend applies to a batch before it runs it (Forward, ForwardArgmax), so that
// the cpu and the cuda backend refuse the same batches with the same message.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/compute/backend.h"

namespace mer {

struct BatchLimits {
  int max_batch_tokens = 0;
  int n_vocab = 0;
  int max_sequences = 0;
  int max_context_tokens = 0;
};

// InvalidArgument naming the first problem: an empty or oversized batch, a token, sequence or
// position out of range, or a sequence whose positions do not continue its cache (seq_len: the
// positions each sequence's cache holds; a lower start rewinds it) without gaps within the batch,
// so that attention never reads a KV entry that was not written. next_pos and seen are scratch
// (resized here; reserve max_sequences to allocate nothing).
absl::Status CheckBatch(absl::Span<const BatchToken> batch, const BatchLimits& limits,
                        absl::Span<const int32_t> seq_len, std::vector<int32_t>* next_pos, std::vector<uint8_t>* seen);

}  // namespace mer
