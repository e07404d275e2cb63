#include "common/gguf/gguf_digest.h"

#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/check.h"

namespace mer {

std::string Sha256Hex(absl::Span<const uint8_t> bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  CHECK(EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) == 1);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

absl::Status VerifySha256(const GgufFile& file, absl::string_view expected_hex) {
  const std::string want = absl::AsciiStrToLower(expected_hex);
  if (want.size() != 64 || want.find_first_not_of("0123456789abcdef") != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat("--verify-model: '", expected_hex, "' is not a SHA-256 (64 hex digits)"));
  const std::string got = Sha256Hex(file.bytes());
  if (got == want) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(file.path(), ": SHA-256 ", got, " over its ", file.file_size(),
                                          " bytes, expected ", want, ": the file is damaged or not the one named"));
}

}  // namespace mer
