// Every header the per-instruction-set kernel bodies (activation.inc, attention.inc, gemm_blocked.inc) use,
// included by isa_<name>.cpp BEFORE they set their compilation target. Why: a function gets the target in force
// where it is declared. Standard-library and loom inline functions and templates declared here keep
// the build's baseline target in every copy, so the linker's one kept copy of, say,
// std::vector<float>::resize can never be an AVX-512 one that an AVX2-only CPU would fault on.
// A kernel body that needs another header adds it here, not in the .inc.
//
// Not here on purpose: simd_math.h, softmax.h and philox.h. They hold the vector code itself, must be
// compiled for each target, and give each copy its own namespace instead (kernel_isa.h).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "backends/cpu/activation.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/gemm_blocked.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/rope.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
