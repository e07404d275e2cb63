// The parts of writing an expert store (docs/expert_store.md) that `mer pack` (packer.h) and
// `mer synth --store-out` (synth_store.h) share, so that both write the same bytes: the blob
// layout, the directory, experts.bin (batches of blobs filled in parallel, each written while the
// next is filled) and the manifest, written last. Not a public interface.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/store/manifest.h"
#include "common/store/packer.h"
#include "common/tensor/ggml_type.h"

namespace mer::store_internal {

// Where gate | up | down of a layer's experts lie in a blob: gate at 0, each next matrix at the
// first multiple of kStoreMatrixAlignment after the previous one. gate and up are [n_ff_exp rows,
// n_embd cols], down [n_embd rows, n_ff_exp cols].
StoreLayer LayoutLayer(GgmlType gate, GgmlType up, GgmlType down, int64_t n_embd, int64_t n_ff_exp);

// From m.layers: blob_bytes (the largest layer's matrices, rounded up to kStoreBlobAlignment),
// blob_stride, experts_bytes, and m.blobs sized (offsets and CRCs are WriteExpertsFile's).
void LayoutBlobs(StoreManifest& m);

// The store's geometry and layout: the model's dimensions, each layer's LayoutLayer from its
// (gate, up, down) types, then LayoutBlobs. *payload_bytes: the experts' matrix bytes in all
// (PackStats::expert_payload_bytes). The identity fields (source, names) are the caller's.
struct LayerTypes {
  GgmlType gate, up, down;
};
StoreManifest LayoutManifest(int n_layer, int n_expert, int64_t n_embd, int64_t n_ff_exp,
                             const std::function<LayerTypes(int layer)>& types, uint64_t* payload_bytes);

// Creates `dir` if missing. A store already there loses its manifest first (AlreadyExists unless
// `overwrite`), so that an interrupted write never leaves a manifest describing files that are
// being rewritten.
absl::Status PrepareStoreDir(const std::string& dir, bool overwrite);

// Writes the three matrices of blob (layer, expert) at the layer's offsets in `blob`; the gaps and
// the tail are zeroed after it. Called on several threads at once.
using BlobFiller = std::function<void(int layer, int expert, uint8_t* blob)>;

struct ExpertsFileOptions {
  int threads = 0;                    // fill threads; 0 = all cores
  bool direct_io = true;              // O_DIRECT where the file system allows it
  uint64_t batch_bytes = 64 << 20;    // blobs filled and written per step (at least one blob)
  // Before blobs [first, first + n) are filled (read-ahead of a source), and after blobs [0, end)
  // are (progress, dropping a source's pages). May be empty.
  std::function<void(uint64_t first, uint64_t n)> before_batch;
  std::function<void(uint64_t end)> after_batch;
};

// Writes experts.bin at `path` in (layer, expert) order, filling m.blobs (offsets, CRC-32C of each
// padded blob). Buffered writes (no O_DIRECT) are flushed and dropped from the page cache as they
// go. *direct tells whether O_DIRECT was used.
absl::Status WriteExpertsFile(StoreManifest& m, const std::string& path, const BlobFiller& fill,
                              const ExpertsFileOptions& options, bool* direct);

// With experts.bin and dense.gguf written: checks that dense.gguf loads as the engine will load it
// (ModelWeights::LoadDense), records its identity and CRC-32C in `m`, and writes the manifest
// (temporary name, fsync, rename, fsync of the directory). Records the committed store's sizes
// (manifest, blob, blob count, experts.bin, dense.gguf) in *stats.
absl::Status CommitStore(StoreManifest& m, const std::string& dir, PackStats* stats);

// fsync of a file, or of a directory.
absl::Status SyncPath(const std::string& path, bool directory);

}  // namespace mer::store_internal
