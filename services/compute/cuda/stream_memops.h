// Stream memory operations (cuStreamWaitValue32, cuStreamWriteValue32: a stream waits on, or
// writes, a 32-bit word in device memory) for the device path's layer gates. They are driver
// API calls, reached through the runtime's driver entry points rather than by linking libcuda, so
// that every binary still starts on a host without a GPU driver (CI) and fails over cleanly.
//
// Thread-safe (the entry points are looked up once).
#pragma once

#include <cstdint>

struct CUstream_st;

namespace mer::cuda {

// Whether the driver offers both operations (looked up on the first call).
bool StreamMemOpsAvailable();
// Whether this process loads kernels lazily (CUDA_MODULE_LOADING, LAZY by default): a kernel's
// first launch may then wait for the whole context to go idle, which a stream waiting on a word
// that only a later launch will write never does (the CUDA programming guide, "Lazy Loading",
// on concurrent execution). Read once, when the context exists.
bool KernelsLoadLazily();
// The stream waits until *word == value. False if the operation could not be enqueued.
bool StreamWaitEqual(CUstream_st* stream, uint32_t* word, uint32_t value);
// The stream writes value to *word once everything before it in the stream is done (a memory
// barrier first: what the stream wrote before is visible to whoever sees the value).
bool StreamWrite(CUstream_st* stream, uint32_t* word, uint32_t value);

}  // namespace mer::cuda
