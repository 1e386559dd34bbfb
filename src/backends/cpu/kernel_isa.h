// Which instruction set the SIMD code of the file being compiled targets, for the headers and kernel
// bodies that have per-ISA code (philox.h, attention.inc, activation.inc). See isa.h.
//
// isa_scalar.cpp, isa_avx2.cpp and isa_avx512.cpp define, before including anything:
//   LOOM_KERNEL_ISA  0 (portable C++), 2 (AVX2 + FMA intrinsics) or 3 (AVX-512 intrinsics);
//   LOOM_KERNEL_NS   the namespace their copies live in (isa_scalar, isa_avx2, isa_avx512).
// Everywhere else both follow the compiler's flags, as before run-time dispatch existed.
//
// Why the namespace: inline functions in headers (simd::exp, philox_tile, ...) are compiled once per
// translation unit and the linker keeps one copy of each. If an AVX-512 copy could stand in for the
// scalar file's, an AVX2-only CPU would fault on it; the per-ISA inline namespace gives each copy its
// own name, so they never merge.
#pragma once

#ifndef LOOM_KERNEL_ISA
#if defined(__AVX512F__)
#define LOOM_KERNEL_ISA 3
#elif defined(__AVX2__) && defined(__FMA__)
#define LOOM_KERNEL_ISA 2
#else
#define LOOM_KERNEL_ISA 0
#endif
#endif

#ifndef LOOM_KERNEL_NS
#define LOOM_KERNEL_NS isa_build
#endif
