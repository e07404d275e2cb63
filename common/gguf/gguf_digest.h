// A model file's SHA-256, the digest model hubs publish for every file they serve, so that a
// GGUF loaded without an expert store (whose files carry CRC-32C checksums) can still be checked
// byte for byte before it is used (`mer-compute --model F.gguf --verify-model SHA256`).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"

namespace mer {

// Lowercase hex SHA-256 of `bytes`.
std::string Sha256Hex(absl::Span<const uint8_t> bytes);

// OK when every byte of `file` hashes to `expected_hex` (64 hex digits, either case).
// InvalidArgument for a malformed digest; DataLoss naming the file and both digests otherwise.
absl::Status VerifySha256(const GgufFile& file, absl::string_view expected_hex);

}  // namespace mer
