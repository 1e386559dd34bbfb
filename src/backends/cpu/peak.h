// Measures the CPU's fused-multiply-add peak: the denominator of MFU.
#pragma once

namespace loom::cpu {

struct FmaPeak {
  double gflops = 0;   // f32 FLOP/s (an FMA counts as 2) over all threads, in GFLOP/s
  int threads = 0;
  int vector_bits = 0; // the SIMD width used: 512 (AVX-512), 256 (AVX2/FMA) or 0 (scalar)
};

// Runs independent FMA chains on every thread for about `seconds` and reports the best rate.
FmaPeak measure_fma_peak(int threads, double seconds = 0.5);

}  // namespace loom::cpu
