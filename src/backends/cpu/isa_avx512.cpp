// The CPU kernels' AVX-512 copy (isa.h): F, DQ, BW and VL, which Skylake-X and every later Intel
// server core, and Zen 4 and 5, have. Only the code after the target pragma is compiled for AVX-512
// (isa_prologue.h says why the headers come first).
#define LOOM_KERNEL_NS isa_avx512
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LOOM_KERNEL_ISA 3
#else
#define LOOM_KERNEL_ISA 0  // not x86: cpu_isa_supported(Avx512) is false; the portable code keeps the link whole
#endif
#include "backends/cpu/isa_prologue.h"

#if LOOM_KERNEL_ISA == 3
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma,f16c")
#endif
#endif

#include "backends/cpu/philox.h"
#include "backends/cpu/simd_math.h"
#include "backends/cpu/softmax.h"

#include "backends/cpu/activation.inc"
#include "backends/cpu/attention.inc"
#include "backends/cpu/gemm_blocked.inc"

#if LOOM_KERNEL_ISA == 3
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
