// libFuzzer target for the expert store's manifest parser (common/store/manifest.h): arbitrary
// bytes must give either a manifest whose every blob lies inside experts.bin and every matrix
// inside its blob, or an error; never a crash, an out-of-bounds read (ASan) or undefined
// behaviour (UBSan). Each input is parsed twice: as is, and with the checksum checks skipped so
// that mutations reach the field checks behind them.
//
//   ./build-fuzz/bin/store_manifest_fuzz -max_total_time=60 tests/fuzz/corpus/store_manifest
//
// The seeds in tests/fuzz/corpus/store_manifest are written by store_manifest_test (see
// WriteSeedCorpus there).
#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"
#include "common/model/model_weights.h"
#include "common/store/manifest.h"

namespace {

void Check(const mer::StoreManifest& m) {
  if (m.layers.size() != m.n_layer || m.blobs.size() != uint64_t{m.n_layer} * m.n_expert) __builtin_trap();
  if (m.blob_bytes % mer::kStoreBlobAlignment != 0 || m.blob_stride < m.blob_bytes) __builtin_trap();
  for (const mer::StoreLayer& l : m.layers) {
    // The views ExpertStore::ExpertView would make must lie inside the blob.
    const mer::MatrixView gate{l.gate_type, m.n_embd, m.n_ff_exp, nullptr};
    const mer::MatrixView up{l.up_type, m.n_embd, m.n_ff_exp, nullptr};
    const mer::MatrixView down{l.down_type, m.n_ff_exp, m.n_embd, nullptr};
    if (static_cast<uint64_t>(gate.rows * gate.row_bytes()) != l.gate_bytes ||
        static_cast<uint64_t>(up.rows * up.row_bytes()) != l.up_bytes ||
        static_cast<uint64_t>(down.rows * down.row_bytes()) != l.down_bytes)
      __builtin_trap();
    if (l.gate_offset + l.gate_bytes > l.up_offset || l.up_offset + l.up_bytes > l.down_offset ||
        l.used_bytes() > m.blob_bytes)
      __builtin_trap();
  }
  for (const mer::StoreBlob& b : m.blobs) {
    if (b.offset % mer::kStoreBlobAlignment != 0 || b.offset + m.blob_bytes > m.experts_bytes) __builtin_trap();
  }
  if (m.dense.header_bytes > m.dense.size || m.source.header_bytes > m.source.size) __builtin_trap();
  // What parses must serialize back to the same manifest.
  const std::string again = mer::SerializeManifest(m);
  auto reparsed = mer::ParseManifest(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(again.data()), again.size()));
  if (!reparsed.ok() || reparsed->blobs.size() != m.blobs.size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> bytes(data, size);
  if (auto m = mer::ParseManifest(bytes); m.ok()) Check(*m);
  mer::ManifestParseOptions no_crc;
  no_crc.verify_checksums = false;
  if (auto m = mer::ParseManifest(bytes, no_crc); m.ok()) Check(*m);
  return 0;
}
