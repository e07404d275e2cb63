// How many worker threads a `--threads N` option asks for.
#pragma once

#include <algorithm>
#include <thread>

namespace mer {

// N when positive, else one per hardware thread (at least one).
inline int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace mer
