// Reader of an expert store (a directory written by `mer pack`, format in docs/expert_store.md):
//
//   STORE/manifest     geometry, tensor types, blob layout, one offset + CRC-32C per blob
//   STORE/experts.bin  one blob per (layer, expert): gate | up | down, 4096-byte aligned and padded
//   STORE/dense.gguf   every non-expert tensor and all metadata of the source GGUF
//
// Open validates the manifest and checks that experts.bin and dense.gguf are the files it
// describes (sizes, dense.gguf's header checksum), so a truncated, foreign or mismatched store is
// refused before any blob is read. Blob contents are checked when read (VerifyBlob) or all at once
// (VerifyAll). The residency daemon reads blobs itself with O_DIRECT (experts_path(), BlobOffset(),
// blob_bytes()) and turns a verified blob into matrix views with ExpertView().
//
// Thread-safety: after Open every method is const and may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/gguf/gguf_file.h"
#include "common/model/model_weights.h"
#include "common/store/manifest.h"

namespace mer {

inline constexpr char kStoreManifestFile[] = "manifest";
inline constexpr char kStoreExpertsFile[] = "experts.bin";
inline constexpr char kStoreDenseFile[] = "dense.gguf";

struct StoreVerifyOptions {
  int threads = 0;                                              // CRC threads; 0 = all cores
  bool dense = true;                                            // also check the whole of dense.gguf against dense_crc
  std::function<void(uint64_t done, uint64_t total)> progress;  // bytes, called now and then
};

struct StoreVerifyStats {
  uint64_t blobs = 0;
  uint64_t bytes = 0;  // experts.bin and dense.gguf bytes read
  double seconds = 0;
};

// An aligned heap buffer for blobs (O_DIRECT wants the buffer, the offset and the length aligned).
struct AlignedFree {
  void operator()(void* p) const;
};
using AlignedBuffer = std::unique_ptr<uint8_t[], AlignedFree>;
AlignedBuffer AllocateAligned(uint64_t bytes, uint64_t alignment = kStoreBlobAlignment);

class ExpertStore {
 public:
  // NotFound when a file is missing; InvalidArgument / DataLoss naming the problem otherwise.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Open(const std::string& dir);
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  const StoreManifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  int n_layer() const { return static_cast<int>(manifest_.n_layer); }
  int n_expert() const { return static_cast<int>(manifest_.n_expert); }

  // Bytes of every blob: one read of this many bytes at BlobOffset fetches an expert. A multiple
  // of 4096, as are the offsets.
  uint64_t blob_bytes() const { return manifest_.blob_bytes; }
  uint64_t BlobOffset(int layer, int expert) const;
  uint32_t BlobCrc(int layer, int expert) const;

  // DataLoss naming the layer and expert when the blob_bytes() bytes at `bytes` are not the blob.
  absl::Status VerifyBlob(int layer, int expert, const void* bytes) const;
  // Views of the expert's gate, up and down in a blob in memory (blob_bytes() bytes, at least
  // 64-byte aligned); valid as long as the blob's memory.
  ExpertWeights ExpertView(int layer, int expert, const void* blob) const;

  // experts.bin, for readers of their own (io_uring, O_DIRECT).
  std::string experts_path() const;
  std::string dense_path() const;
  // A read-only descriptor of experts.bin, opened with O_DIRECT where the file system allows it
  // (direct_io()); owned by the store.
  int experts_fd() const { return fd_; }
  bool direct_io() const { return direct_; }

  // Reads blob (layer, expert) with pread into `buffer` (blob_bytes(), 4096-aligned) and verifies
  // it. Unavailable for an I/O error, DataLoss for a short read or a checksum mismatch.
  absl::Status ReadBlob(int layer, int expert, void* buffer) const;

  // Reads all of experts.bin (and dense.gguf) and checks every checksum. DataLoss lists the bad
  // blobs (the first few by layer and expert, and how many).
  absl::StatusOr<StoreVerifyStats> VerifyAll(const StoreVerifyOptions& options = {}) const;

  // Maps dense.gguf and checks every byte of the mapping against the manifest's dense_crc, and
  // its mer.store.blob_table_crc against the blob table: DataLoss naming the file otherwise. The
  // weights and the tokenizer are read from this mapping, so what is served is what was checked.
  absl::StatusOr<std::shared_ptr<const GgufFile>> OpenDense() const;
  // OpenDense, then ModelWeights::LoadDense; InvalidArgument when its geometry is not the
  // manifest's.
  absl::StatusOr<std::unique_ptr<ModelWeights>> LoadDenseWeights() const;

  // OK when `gguf_path` is the file this store was packed from (size, mtime, header checksum);
  // FailedPrecondition naming the difference otherwise.
  absl::Status CheckSource(const std::string& gguf_path) const;

 private:
  ExpertStore() = default;
  std::string dir_;
  StoreManifest manifest_;
  int fd_ = -1;
  bool direct_ = false;
};

// Identity of a file for a manifest: its size and the CRC-32C of its first `header_bytes` bytes
// (for a GGUF, its data_offset(): header, metadata and tensor infos).
absl::StatusOr<StoreFileIdentity> FileIdentity(const std::string& path, uint64_t header_bytes);
// The file's modification time in nanoseconds since the epoch.
absl::StatusOr<int64_t> FileMtimeNs(const std::string& path);

}  // namespace mer
