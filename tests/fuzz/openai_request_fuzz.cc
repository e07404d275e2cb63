// libFuzzer target for the HTTP API's request parsing (services/gateway/openai_request.h), which
// reads untrusted JSON bodies from the network, and for the validation every parsed request goes
// through next (request_validation.h, against a synthetic vocabulary). The first byte picks the
// endpoint (completions or chat), the rest is the body. Checks: parsing returns a status (no
// crash); a rejection is InvalidArgument and its OpenAI error body is valid JSON with status 400;
// an accepted request's prompts are checked by the validation without a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/check.h"
#include "services/gateway/openai_request.h"
#include "services/gateway/request_validation.h"

using mer::gateway::openai::Endpoint;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mer::Tokenizer* const tokenizer =
      new mer::Tokenizer(*mer::Tokenizer::Create(mer::MakeSyntheticVocab(400, 50)));
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] % 2 == 0 ? Endpoint::kCompletions : Endpoint::kChatCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const absl::StatusOr<mer::gateway::openai::ParsedRequest> r = mer::gateway::openai::ParseRequest(endpoint, body);
  if (!r.ok()) {
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    const mer::gateway::openai::HttpError e = mer::gateway::openai::ErrorFromStatus(r.status());
    CHECK(e.status == 400);
    CHECK(!nlohmann::ordered_json::parse(e.body, nullptr, false).is_discarded());
    return 0;
  }
  CHECK(r->n >= 1);
  const mer::gateway::ModelLimits limits{400, 256, 1024};
  for (const mer::v1::GenerateRequest& prompt : r->prompts) {
    mer::v1::GenerateRequest g = r->options;
    g.MergeFrom(prompt);
    (void)mer::gateway::ValidateGenerateRequest(g, *tokenizer, limits);
  }
  return 0;
}
