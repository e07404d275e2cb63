#include "services/compute/batch_check.h"

#include "absl/strings/str_cat.h"

namespace mer {

absl::Status CheckBatch(absl::Span<const BatchToken> batch, const BatchLimits& limits,
                        absl::Span<const int32_t> seq_len, std::vector<int32_t>* next_pos, std::vector<uint8_t>* seen) {
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  if (batch.size() > static_cast<size_t>(limits.max_batch_tokens))
    return absl::InvalidArgumentError(
        absl::StrCat("batch of ", batch.size(), " tokens exceeds max_batch_tokens ", limits.max_batch_tokens));
  next_pos->assign(seq_len.begin(), seq_len.end());
  seen->assign(limits.max_sequences, 0);
  for (const BatchToken& b : batch) {
    if (b.token < 0 || b.token >= limits.n_vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", b.token, " is outside the vocabulary [0, ", limits.n_vocab, ")"));
    if (b.sequence < 0 || b.sequence >= limits.max_sequences)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", b.sequence, " out of range"));
    if (b.position < 0 || b.position >= limits.max_context_tokens)
      return absl::InvalidArgumentError(
          absl::StrCat("position ", b.position, " is outside the context of ", limits.max_context_tokens, " tokens"));
    int32_t& next = (*next_pos)[b.sequence];
    if (!(*seen)[b.sequence]) {
      (*seen)[b.sequence] = 1;
      if (b.position > next)
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", b.sequence, " position ", b.position, " skips ahead of ", next));
    } else if (b.position != next) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", b.sequence, " positions are not consecutive in the batch"));
    }
    next = b.position + 1;
  }
  return absl::OkStatus();
}

}  // namespace mer
