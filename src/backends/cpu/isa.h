// Run-time choice of the instruction set the CPU kernels run with.
//
// Why: a binary must run on every x86-64 CPU it is copied to, and use what each one has. The kernels
// whose speed depends on the vector width (activations and dropout, flash attention with its Philox
// draws) are compiled three times, each copy in its own translation unit with its own target:
//   isa_scalar.cpp  the portable C++ (GCC vector extensions, `omp simd`), built for the build's
//                   baseline flags: the reference the other two are tested against;
//   isa_avx2.cpp    + AVX2 and FMA (Haswell, Zen 1-3): 8-float registers, the 6x16 attention tile;
//   isa_avx512.cpp  + AVX-512 F/BW/VL/DQ (Skylake-X, Sapphire Rapids, Zen 4/5): 16-float registers.
// dispatch.cpp holds the families' API functions; each calls the copy cpu_isa() names.
// isa_avx2.cpp also holds the blocked GEMM (gemm_blocked.h), which exists only as that copy: gemm.cpp
// calls it directly when it chooses it (gemm.h, GemmKernel), on CPUs with AVX2 whatever cpu_isa() says.
//
// The choice: LOOM_CPU_ISA=scalar|avx2|avx512 if set (an error if this CPU cannot run it: the tests use
// it to run one variant on purpose), else the widest the CPU and the OS support (CPUID, and XGETBV for
// the register state the OS saves). It is made once, on first use; set_cpu_isa changes it for tests
// and benchmarks. The choice never changes a result's meaning, only its speed and, where the compiler
// contracts a*b+c into an FMA on one target and not the other, the last bits (the tests state the
// tolerance they allow).
//
// With LOOM_NATIVE=ON (CMake's default) every other file is compiled for the build machine
// (-march=native), so the binary as a whole runs only on CPUs with the build machine's instruction
// set; the dispatch then picks among variants for the machine the binary runs on. LOOM_NATIVE=OFF
// builds a binary for any x86-64 CPU (docs/roofline.md, "Instruction sets").
#pragma once

#include <vector>

namespace loom::cpu {

enum class CpuIsa { Scalar, Avx2, Avx512 };

const char* cpu_isa_name(CpuIsa isa);
// Whether this CPU (and OS) can run the variant. Scalar always can.
bool cpu_isa_supported(CpuIsa isa);
// Whether the CPU has AVX512-BF16 (`vdpbf16ps`) besides the AVX-512 that isa_avx512.cpp needs: the blocked
// GEMM's bf16 pairs path (gemm_blocked.h) and the bf16 peak (peak.h) run only where it is.
bool cpu_has_avx512_bf16();
// Whether the CPU has AMX-BF16 tiles (Sapphire Rapids and later), which oneDNN's bf16 kernels use: gemm.cpp
// leaves every GEMM to oneDNN there.
bool cpu_has_amx_bf16();
// Every variant cpu_isa_supported accepts, narrowest first: what the tests loop over.
std::vector<CpuIsa> supported_cpu_isas();
// The variant the kernels use now (see the header comment for how it is chosen).
CpuIsa cpu_isa();
// Makes the kernels use `isa` from now on, process-wide; an error naming it if this CPU cannot run it.
void set_cpu_isa(CpuIsa isa);
// Parses "scalar", "avx2" or "avx512"; an error naming the text otherwise.
CpuIsa parse_cpu_isa(const char* text);

// Sets the ISA for a scope and restores the previous one (tests, benchmarks).
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(CpuIsa isa) : previous_(cpu_isa()) { set_cpu_isa(isa); }
  ~ScopedCpuIsa() { set_cpu_isa(previous_); }
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

 private:
  CpuIsa previous_;
};

}  // namespace loom::cpu
