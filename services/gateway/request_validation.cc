#include "services/gateway/request_validation.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "services/gateway/text_stream.h"

namespace mer::gateway {
namespace {

using google::protobuf::internal::WireFormatLite;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckUtf8(absl::string_view field, absl::string_view s) {
  const size_t at = Utf8ErrorOffset(s);
  if (at == s.size()) return absl::OkStatus();
  return Bad(field, absl::StrCat("not valid UTF-8 at byte ", at, " of ", s.size()));
}

// Calls on_bytes(field number, bytes) for every length-delimited field at the top level of the
// serialized message `wire`, in wire order. A message that does not decode is left to the
// protobuf parser to report.
absl::Status ForEachBytesField(absl::string_view wire,
                               const std::function<absl::Status(int, absl::string_view)>& on_bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(wire.data()),
                                            static_cast<int>(wire.size()));
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (!WireFormatLite::SkipField(&in, tag)) return absl::OkStatus();
      continue;
    }
    uint32_t length;
    if (!in.ReadVarint32(&length)) return absl::OkStatus();
    const size_t at = static_cast<size_t>(in.CurrentPosition());
    if (length > wire.size() - at) return absl::OkStatus();
    RETURN_IF_ERROR(on_bytes(WireFormatLite::GetTagFieldNumber(tag), wire.substr(at, length)));
    if (!in.Skip(static_cast<int>(length))) return absl::OkStatus();
  }
  return absl::OkStatus();
}

template <typename Message>
absl::StatusOr<Message> ParseMessage(absl::string_view wire) {
  Message m;
  if (!m.ParseFromArray(wire.data(), static_cast<int>(wire.size())))
    return absl::InvalidArgumentError(
        absl::StrCat("request: ", wire.size(), " bytes that are not a ", Message::descriptor()->full_name()));
  return m;
}

}  // namespace

int32_t MaxTokenBytes(const Tokenizer& tokenizer) {
  size_t longest = 1;
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    longest =
        std::max({longest, tokenizer.TokenPiece(id, /*render_special=*/true).size(), tokenizer.TokenText(id).size()});
  }
  return static_cast<int32_t>(std::min<size_t>(longest, INT32_MAX));
}

absl::StatusOr<mer::v1::GenerateRequest> ParseGenerateRequest(absl::string_view wire) {
  using R = mer::v1::GenerateRequest;
  bool text = false, ids = false;
  int stops = 0;
  RETURN_IF_ERROR(ForEachBytesField(wire, [&](int field, absl::string_view bytes) -> absl::Status {
    switch (field) {
      case R::kTextFieldNumber:
        text = true;
        return CheckUtf8("prompt.text", bytes);
      case R::kTokenIdsFieldNumber:
        ids = true;
        return absl::OkStatus();
      case R::kStopFieldNumber:
        return CheckUtf8(absl::StrCat("stop[", stops++, "]"), bytes);
      default:
        return absl::OkStatus();
    }
  }));
  if (text && ids) return Bad("prompt", "both text and token_ids are set; set one of them");
  return ParseMessage<R>(wire);
}

absl::StatusOr<mer::v1::TokenizeRequest> ParseTokenizeRequest(absl::string_view wire) {
  using R = mer::v1::TokenizeRequest;
  RETURN_IF_ERROR(ForEachBytesField(wire, [&](int field, absl::string_view bytes) {
    return field == R::kTextFieldNumber ? CheckUtf8("text", bytes) : absl::OkStatus();
  }));
  return ParseMessage<R>(wire);
}

absl::Status CheckPromptText(absl::string_view text, bool bos, const ModelLimits& model, const RequestLimits& limits) {
  if (text.empty()) return Bad("prompt.text", "empty");
  if (static_cast<int64_t>(text.size()) > limits.max_prompt_bytes)
    return Bad("prompt.text", absl::StrCat(text.size(), " bytes; at most ", limits.max_prompt_bytes));
  RETURN_IF_ERROR(CheckUtf8("prompt.text", text));
  const int64_t per_token = std::max<int32_t>(1, model.max_token_bytes);
  const int64_t at_least = (static_cast<int64_t>(text.size()) + per_token - 1) / per_token + (bos ? 1 : 0);
  if (at_least > model.max_context_tokens)
    return Bad("prompt", absl::StrCat("the text (", text.size(), " bytes) is at least ", at_least,
                                      " tokens; the context holds ", model.max_context_tokens));
  return absl::OkStatus();
}

absl::StatusOr<ValidatedRequest> ValidateGenerateRequest(const mer::v1::GenerateRequest& request,
                                                         const Tokenizer& tokenizer, const ModelLimits& model,
                                                         const RequestLimits& limits) {
  ValidatedRequest v;
  auto* prompt = v.compute.mutable_prompt();
  // The prompt's size, bounded before anything is allocated for it.
  const bool bos = tokenizer.add_bos() && tokenizer.bos_id() >= 0;
  switch (request.prompt_case()) {
    case mer::v1::GenerateRequest::kText:
      RETURN_IF_ERROR(CheckPromptText(request.text(), bos, model, limits));
      break;
    case mer::v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return Bad("prompt.token_ids", "empty");
      if (ids.size() > model.max_context_tokens)
        return Bad("prompt", absl::StrCat(ids.size(), " tokens; the context holds ", model.max_context_tokens));
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= model.vocab_size)
          return Bad(absl::StrCat("prompt.token_ids[", i, "]"),
                     absl::StrCat("token ", ids[i], " is not in the vocabulary [0, ", model.vocab_size, ")"));
      }
      break;
    }
    default:
      return Bad("prompt", "missing: set text or token_ids");
  }
  // Every field that needs no tokens.
  if (request.max_new_tokens() < 1)
    return Bad("max_new_tokens", absl::StrCat("must be >= 1, got ", request.max_new_tokens()));
  if (!(request.temperature() >= 0) || std::isinf(request.temperature()))
    return Bad("temperature", absl::StrCat("must be a finite value >= 0, got ", request.temperature()));
  if (request.top_k() < 0) return Bad("top_k", absl::StrCat("must be >= 0, got ", request.top_k()));
  const float top_p = request.has_top_p() ? request.top_p() : 1.0f;
  if (!(top_p > 0 && top_p <= 1)) return Bad("top_p", absl::StrCat("must be in (0, 1], got ", top_p));
  const float penalty = request.has_repetition_penalty() ? request.repetition_penalty() : 1.0f;
  if (!(penalty > 0 && penalty <= 10))
    return Bad("repetition_penalty", absl::StrCat("must be in (0, 10], got ", penalty));
  const float min_p = request.has_min_p() ? request.min_p() : 0.0f;
  if (!(min_p >= 0 && min_p <= 1)) return Bad("min_p", absl::StrCat("must be in [0, 1], got ", min_p));
  for (const auto& [field, value] : {std::pair{"presence_penalty", request.presence_penalty()},
                                     std::pair{"frequency_penalty", request.frequency_penalty()}}) {
    if (!(value >= -2 && value <= 2)) return Bad(field, absl::StrCat("must be in [-2, 2], got ", value));
  }
  if (request.logit_bias_size() > limits.max_logit_bias)
    return Bad("logit_bias", absl::StrCat(request.logit_bias_size(), " entries; at most ", limits.max_logit_bias));
  for (const auto& [id, bias] : request.logit_bias()) {
    const std::string field = absl::StrCat("logit_bias[", id, "]");
    if (id < 0 || id >= model.vocab_size)
      return Bad(field, absl::StrCat("token ", id, " is not in the vocabulary [0, ", model.vocab_size, ")"));
    if (!(bias >= -100 && bias <= 100)) return Bad(field, absl::StrCat("must be in [-100, 100], got ", bias));
  }
  if (request.stop_token_ids_size() > limits.max_stop_token_ids)
    return Bad("stop_token_ids",
               absl::StrCat(request.stop_token_ids_size(), " ids; at most ", limits.max_stop_token_ids));
  for (int i = 0; i < request.stop_token_ids_size(); ++i) {
    const int32_t id = request.stop_token_ids(i);
    if (id < 0 || id >= model.vocab_size)
      return Bad(absl::StrCat("stop_token_ids[", i, "]"),
                 absl::StrCat("token ", id, " is not in the vocabulary [0, ", model.vocab_size, ")"));
  }
  if (request.top_logprobs() < 0 || request.top_logprobs() > 20)
    return Bad("top_logprobs", absl::StrCat("must be in [0, 20], got ", request.top_logprobs()));
  if (request.top_logprobs() > 0 && !request.logprobs()) return Bad("top_logprobs", "needs logprobs");
  if (request.priority() < -limits.max_priority || request.priority() > limits.max_priority)
    return Bad("priority", absl::StrCat("must be in [", -limits.max_priority, ", ", limits.max_priority, "], got ",
                                        request.priority()));
  if (request.stop_size() > limits.max_stop_sequences)
    return Bad("stop", absl::StrCat(request.stop_size(), " stop sequences; at most ", limits.max_stop_sequences));
  for (int i = 0; i < request.stop_size(); ++i) {
    const std::string& s = request.stop(i);
    const std::string field = absl::StrCat("stop[", i, "]");
    if (s.empty()) return Bad(field, "empty");
    if (static_cast<int>(s.size()) > limits.max_stop_bytes)
      return Bad(field, absl::StrCat(s.size(), " bytes; at most ", limits.max_stop_bytes));
    RETURN_IF_ERROR(CheckUtf8(field, s));
    v.stops.push_back(s);
  }

  // The prompt's tokens, and what they need of the context.
  if (request.prompt_case() == mer::v1::GenerateRequest::kText) {
    if (bos) prompt->Add(tokenizer.bos_id());
    const std::vector<int32_t> ids = tokenizer.Encode(request.text(), /*parse_special=*/true);
    prompt->Add(ids.begin(), ids.end());
    if (prompt->empty()) return Bad("prompt.text", "tokenizes to no tokens");
  } else {
    prompt->Add(request.token_ids().ids().begin(), request.token_ids().ids().end());
  }
  const int64_t n_prompt = prompt->size();
  if (n_prompt > model.max_context_tokens)
    return Bad("prompt", absl::StrCat(n_prompt, " tokens; the context holds ", model.max_context_tokens));
  const int64_t need = n_prompt + request.max_new_tokens() - 1;
  if (need > model.max_context_tokens)
    return Bad("max_new_tokens", absl::StrCat(request.max_new_tokens(), " past the context: prompt (", n_prompt,
                                              " tokens) + max_new_tokens - 1 = ", need,
                                              " positions; the context holds ", model.max_context_tokens));
  if (model.kv_budget_tokens > 0 && need > model.kv_budget_tokens)
    return Bad("max_new_tokens", absl::StrCat("the request needs ", need, " KV positions; the whole KV budget is ",
                                              model.kv_budget_tokens));
  v.compute.set_max_new_tokens(request.max_new_tokens());
  std::vector<int32_t> stop_ids(request.stop_token_ids().begin(), request.stop_token_ids().end());
  if (!request.ignore_eos()) {
    const std::vector<int32_t> eog = tokenizer.EndOfGenerationIds();
    stop_ids.insert(stop_ids.end(), eog.begin(), eog.end());
  }
  std::sort(stop_ids.begin(), stop_ids.end());
  stop_ids.erase(std::unique(stop_ids.begin(), stop_ids.end()), stop_ids.end());
  v.compute.mutable_stop_token_ids()->Add(stop_ids.begin(), stop_ids.end());
  v.compute.set_logprobs(request.logprobs());
  v.compute.set_top_logprobs(request.top_logprobs());
  auto* s = v.compute.mutable_sampling();
  s->set_temperature(request.temperature());
  s->set_top_k(request.top_k());
  s->set_top_p(top_p);
  s->set_seed(request.seed());
  s->set_repetition_penalty(penalty);
  s->set_min_p(min_p);
  s->set_presence_penalty(request.presence_penalty());
  s->set_frequency_penalty(request.frequency_penalty());
  s->mutable_logit_bias()->insert(request.logit_bias().begin(), request.logit_bias().end());
  v.priority = request.priority();
  v.kv_tokens = need;
  return v;
}

}  // namespace mer::gateway
