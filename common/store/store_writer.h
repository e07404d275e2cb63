// The parts of writing an expert store (docs/expert_store.md) that `mer pack` (packer.h) and
// `mer synth --store-out` (synth_store.h) share, so that both write the same bytes: the blob
// layout, the directory, experts.bin (batches of blobs filled in parallel, each written while the
// next is filled) and the manifest, written last. Not a public interface.
#pragma once

#include <chrono>
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

// A store being written beside its final place: a fresh directory next to `dir` (same file
// system, named ".NAME.pack-PID-XXXXXX"), into which the writer puts experts.bin, dense.gguf and
// finally the manifest (CommitStore), and which Publish() then puts in place of `dir` in one
// rename: renameat2(RENAME_EXCHANGE) when a store is already there, so that `dir` is at every
// moment either the old store or the new one, never a mix. Processes that opened the old store's
// files (a live mer-residency reading experts.bin) keep reading them: the old files are unlinked,
// not overwritten. A writer killed before Publish leaves `dir` as it was and its staging directory
// beside it, which the next Begin for the same `dir` removes once its writer's pid is gone.
class StagedStore {
 public:
  // AlreadyExists when `dir` holds a store and !overwrite; InvalidArgument when `dir` exists and
  // holds anything but an (incomplete) store's files.
  static absl::StatusOr<StagedStore> Begin(const std::string& dir, bool overwrite);
  StagedStore(StagedStore&& other) noexcept;
  StagedStore& operator=(StagedStore&&) = delete;
  ~StagedStore();  // removes the staging directory if Publish did not happen

  // Where the store's files are written.
  const std::string& path() const { return staging_; }
  // fsync of the staging directory, the exchange (or rename) into `dir`, fsync of the parent,
  // then removal of the old store's files.
  absl::Status Publish();

 private:
  StagedStore(std::string dir, std::string staging) : dir_(std::move(dir)), staging_(std::move(staging)) {}
  std::string dir_;
  std::string staging_;  // empty once published or moved from
};

// Why `dir` holds no store, for a reader that found no manifest there: FailedPrecondition
// "incomplete store (interrupted pack)" naming the files found when some of a store's files are
// there (a pack was killed, or a store of an older mer lost its manifest to one), or naming the
// staging directory an interrupted pack left beside it; NotFound otherwise.
absl::Status NoStoreStatus(const std::string& dir);

// Removes the files a store consists of (manifest, experts.bin, dense.gguf, manifest.tmp) from
// `dir`, then `dir` itself (left in place if it holds anything else).
void RemoveStoreFiles(const std::string& dir);

// Writes the three matrices of blob (layer, expert) at the layer's offsets in `blob`; the gaps and
// the tail are zeroed after it. Called on several threads at once.
using BlobFiller = std::function<void(int layer, int expert, uint8_t* blob)>;

struct ExpertsFileOptions {
  int threads = 0;                  // fill threads; 0 = all cores
  bool direct_io = true;            // O_DIRECT where the file system allows it
  uint64_t batch_bytes = 64 << 20;  // blobs filled and written per step (at least one blob)
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

// Seconds from `start` to now: the timings of PackStats.
double SecondsSince(std::chrono::steady_clock::time_point start);

}  // namespace mer::store_internal
