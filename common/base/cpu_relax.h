// A spin-wait's pause: tells the core this thread is waiting, so that it spends less power and
// yields its pipeline to the sibling hyperthread, without leaving the CPU.
#pragma once

namespace mer {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace mer
