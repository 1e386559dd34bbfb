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

// The bf16 dot-product peak (AVX512-BF16 `vdpbf16ps`: 32 bf16 products summed into 16 f32 lanes, 64
// FLOPs an instruction), when the CPU has the instruction: chosen at run time, so a build on any
// machine measures it where it exists. gflops = 0 (vector_bits 0) on a CPU without it. AMX tiles are
// not measured: this is the vector-unit peak, the roof of a vdpbf16ps GEMM.
FmaPeak measure_bf16_dot_peak(int threads, double seconds = 0.5);
bool cpu_has_bf16_dot();

}  // namespace loom::cpu
