// `mer pack`: writes an expert store (docs/expert_store.md) from a qwen3moe GGUF.
//
// Packing streams: the GGUF is memory-mapped, each batch of blobs (~64 MiB) is copied from the
// mapping into an aligned buffer by a few threads (gate | up | down, zero padding, CRC-32C) and
// written while the next batch is filled; pages of the source are dropped from the process once
// their layer is packed, and experts.bin is written with O_DIRECT where the file system allows it
// (otherwise buffered, with written ranges flushed and dropped from the page cache as it goes), so
// memory use stays at a few batches whatever the model's size. dense.gguf streams through
// GgufWriter tensor by tensor. The manifest is written last (to a temporary name, fsync'ed and
// renamed): a directory without a valid manifest is not a store.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace mer {

struct PackOptions {
  int threads = 0;         // copy/CRC threads; 0 = all cores
  bool direct_io = true;   // O_DIRECT writes of experts.bin where supported
  bool overwrite = false;  // replace an existing store in the directory
  std::function<void(int layers_done, int n_layer)> progress;
};

struct PackStats {
  uint64_t blob_bytes = 0;  // bytes per blob (read size)
  uint64_t blob_count = 0;
  uint64_t expert_payload_bytes = 0;  // gate + up + down bytes without padding
  uint64_t experts_bytes = 0;         // size of experts.bin
  uint64_t dense_bytes = 0;           // size of dense.gguf
  uint64_t dense_tensors = 0;
  uint64_t manifest_bytes = 0;
  bool direct_io = false;      // experts.bin was written with O_DIRECT
  double experts_seconds = 0;  // writing experts.bin
  double seconds = 0;          // everything
};

// Packs `gguf_path` into the directory `dir` (created if missing). AlreadyExists when `dir`
// holds a store and !options.overwrite; InvalidArgument for a GGUF the model loader refuses;
// Unimplemented for a metadata value GgufWriter cannot reproduce exactly.
absl::StatusOr<PackStats> PackExpertStore(const std::string& gguf_path, const std::string& dir,
                                          const PackOptions& options = {});

}  // namespace mer
