// The CPU kernels' portable copy (isa.h): no target of its own, so exactly the build's flags (with
// LOOM_NATIVE=OFF, baseline x86-64: what any CPU runs, and the reference the AVX2 and AVX-512 copies
// are tested against). No intrinsics: GCC vector extensions and `omp simd` only.
#define LOOM_KERNEL_ISA 0
#define LOOM_KERNEL_NS isa_scalar
#include "backends/cpu/isa_prologue.h"

#include "backends/cpu/philox.h"
#include "backends/cpu/simd_math.h"
#include "backends/cpu/softmax.h"

#include "backends/cpu/activation.inc"
#include "backends/cpu/attention.inc"
