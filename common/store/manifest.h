// The manifest of an expert store: the binary, versioned, checksummed description of experts.bin
// (geometry, per-layer tensor types and the layout of a blob, one offset and CRC-32C per blob),
// of dense.gguf, and of the GGUF the store was packed from. Format: docs/expert_store.md.
//
// ParseManifest checks every field, count and offset before anything is sized from it (the same
// rigour as the GGUF reader; fuzzed by tests/fuzz/store_manifest_fuzz.cc), so a parsed manifest's
// every blob lies inside experts.bin and every matrix inside its blob.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tensor/ggml_type.h"

namespace mer {

inline constexpr char kStoreManifestMagic[8] = {'M', 'E', 'R', 'S', 'T', 'O', 'R', 'E'};
inline constexpr uint32_t kStoreFormatVersion = 1;
inline constexpr uint64_t kStoreBlobAlignment = 4096;  // blob sizes, strides and offsets
inline constexpr uint64_t kStoreMatrixAlignment = 64;  // matrix offsets inside a blob
inline constexpr size_t kStoreHeaderBytes = 128;
inline constexpr size_t kStoreLayerBytes = 64;
inline constexpr size_t kStoreBlobEntryBytes = 16;
inline constexpr uint32_t kStoreMaxSourceName = 4096;

// Where gate, up and down of every expert of one layer lie in its blob, and their types.
struct StoreLayer {
  GgmlType gate_type = GgmlType::kF32;
  GgmlType up_type = GgmlType::kF32;
  GgmlType down_type = GgmlType::kF32;
  uint64_t gate_offset = 0, gate_bytes = 0;  // [n_ff_exp rows, n_embd cols]
  uint64_t up_offset = 0, up_bytes = 0;      // [n_ff_exp rows, n_embd cols]
  uint64_t down_offset = 0, down_bytes = 0;  // [n_embd rows, n_ff_exp cols]

  uint64_t used_bytes() const { return down_offset + down_bytes; }
};

struct StoreBlob {
  uint64_t offset = 0;  // in experts.bin
  uint32_t crc = 0;     // CRC-32C of the blob's blob_bytes bytes, padding included
};

// Identity of a file the store refers to: its size and the CRC-32C of its first header_bytes
// bytes (a GGUF's header, metadata and tensor infos: everything before the data section).
struct StoreFileIdentity {
  uint64_t size = 0;
  uint64_t header_bytes = 0;
  uint32_t header_crc = 0;
};

struct StoreManifest {
  uint32_t version = kStoreFormatVersion;
  uint32_t n_layer = 0;
  uint32_t n_expert = 0;
  uint32_t n_embd = 0;
  uint32_t n_ff_exp = 0;
  uint64_t blob_bytes = 0;     // bytes of every blob: the size of one read
  uint64_t blob_stride = 0;    // distance between consecutive blobs in experts.bin
  uint64_t experts_bytes = 0;  // size of experts.bin
  StoreFileIdentity dense;     // dense.gguf
  uint32_t dense_crc = 0;      // CRC-32C of all of dense.gguf
  StoreFileIdentity source;    // the GGUF the store was packed from
  int64_t source_mtime_ns = 0;
  std::string source_name;         // its path when packed, informational
  std::vector<StoreLayer> layers;  // [n_layer]
  std::vector<StoreBlob> blobs;    // [n_layer * n_expert], layer-major

  const StoreBlob& blob(int layer, int expert) const { return blobs[static_cast<size_t>(layer) * n_expert + expert]; }
};

struct ManifestParseOptions {
  // false skips the two CRC checks (and only those): for fuzzing the checks behind them.
  bool verify_checksums = true;
};

// Parses and validates a manifest. InvalidArgument for what is not a version-1 manifest (magic,
// version) or describes an impossible store; DataLoss for a checksum mismatch or a size that does
// not match what the header describes (truncated or extended). Messages name the field.
absl::StatusOr<StoreManifest> ParseManifest(absl::Span<const uint8_t> bytes, const ManifestParseOptions& options = {});

// The manifest's bytes, checksums filled in. The manifest must be valid (ParseManifest of the
// result succeeds); the caller builds it so.
std::string SerializeManifest(const StoreManifest& manifest);

// CRC-32C of the blob table as serialized (n_blobs x 16 bytes): a fingerprint of every expert's
// bytes, which dense.gguf carries as metadata key `mer.store.blob_table_crc`.
uint32_t BlobTableCrc(const StoreManifest& manifest);

inline constexpr char kDenseBlobTableCrcKey[] = "mer.store.blob_table_crc";

}  // namespace mer
