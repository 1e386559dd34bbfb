// Permission to use AMX's tile registers, asked of the OS once per process.
//
// Why here: both the grouped bf16 GEMM (backends/cpu/gemm.cpp) and the quantized int8 matmul
// (quant/qmatmul.cpp) use AMX tiles, and Linux hands out their 8 KiB of state only on request
// (>= 5.16: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), for every thread of the process). A
// refusal (an older kernel, a seccomp filter, a hypervisor without it) leaves the AMX paths unused rather
// than faulting at the first tile instruction. The caller checks CPUID for the AMX features first.
#pragma once

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace loom {

inline bool amx_tile_state_granted() {
  static const bool granted = [] {
#if defined(__linux__) && defined(__x86_64__) && defined(SYS_arch_prctl)
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return granted;
}

}  // namespace loom
