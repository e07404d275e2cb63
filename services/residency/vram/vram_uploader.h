// RAM -> VRAM uploads into the expert arena that mer-compute exported through CUDA IPC
// (docs/cuda.md, "The arena over CUDA IPC"). The seam between mer-residency's loop and the GPU:
// CudaVramUploader (cuda_vram_uploader.cc, in builds with MER_CUDA) and fakes in tests.
//
// A copy is complete when Poll returns its tag: its bytes are then in device memory, and a reader
// that learns of them afterwards (through the residency table or a Completion) sees them; the
// loop publishes an upload only after that. Start never blocks on the copy.
//
// Thread-safety: one thread (the daemon's loop).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/shm/vram_arena.h"

namespace mer::residency {

class VramUploader {
 public:
  virtual ~VramUploader() = default;

  // Opens the arena `info` describes (after closing the current one, if any); on error no arena
  // is open.
  virtual absl::Status Import(const shm::VramArenaInfo& info) = 0;
  // Waits for the copies in flight (their tags are dropped) and closes the arena. Idempotent.
  virtual void Close() = 0;
  // Starts copying `bytes` bytes from `src` (host memory, the RAM tier) to the start of arena slot
  // `slot`; `tag` comes back from Poll once the copy is complete. InvalidArgument for a slot or a
  // size outside the arena, FailedPrecondition with no arena open; ResourceExhausted when
  // max_inflight() copies are in flight.
  virtual absl::Status Start(uint32_t slot, const void* src, uint64_t bytes, uint64_t tag) = 0;
  // Starts copying `bytes` bytes from the start of arena slot `slot` to `dst` (host memory, the
  // RAM tier): an expert demoted from VRAM. In stream order with Start: a later upload into the
  // slot overwrites it only after this copy has read it. The same limits and errors as Start.
  virtual absl::Status StartDownload(uint32_t slot, void* dst, uint64_t bytes, uint64_t tag) = 0;
  // Appends the tags of the copies that completed since the last call. Never blocks. An error is
  // a failed copy (the arena is unusable then: the caller drops it).
  virtual absl::Status Poll(std::vector<uint64_t>* done) = 0;
  virtual int inflight() const = 0;
  virtual int max_inflight() const = 0;
  virtual std::string Describe() const = 0;
};

// Makes the uploader for a RAM tier at [ram_pool, ram_pool + ram_pool_bytes), called when compute
// first exports an arena.
using VramUploaderFactory = std::function<absl::StatusOr<std::unique_ptr<VramUploader>>()>;

// The CUDA uploader: its own stream, max_inflight copies in flight, each followed by an event;
// the RAM pool is registered for DMA (cudaHostRegister) at the first Import unless it is already.
// Unimplemented in a build without CUDA (MER_CUDA=OFF): such a mer-residency refuses arenas and
// VRAM demands, saying so.
absl::StatusOr<std::unique_ptr<VramUploader>> CreateCudaVramUploader(void* ram_pool, uint64_t ram_pool_bytes,
                                                                     int max_inflight);

}  // namespace mer::residency
