// Run-time instruction-set choice for the CPU kernels: see isa.h.
#include "backends/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/error.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif

namespace loom::cpu {
namespace {

struct Features {
  bool avx2 = false, avx512 = false, avx512_bf16 = false, amx_bf16 = false;
};

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Read from CPUID and XCR0 directly (as quant/qmatmul.cpp does): AVX needs the OS to save the ymm
// state, AVX-512 the zmm and mask state, and __builtin_cpu_supports does not check the latter.
Features read_features() {
  Features f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  if (!osxsave || !avx) return f;
  unsigned xcr0_lo, xcr0_hi;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  const bool ymm_state = (xcr0_lo & 0x6) == 0x6, zmm_state = (xcr0_lo & 0xe6) == 0xe6;
  if (!ymm_state || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  f.avx2 = ((b >> 5) & 1) && fma;
  // AVX-512 F (EBX bit 16), DQ (17), BW (30), VL (31): what isa_avx512.cpp is compiled for.
  f.avx512 = f.avx2 && zmm_state && ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
  // AVX512-BF16: leaf 7 subleaf 1, EAX bit 5 (Cooper Lake, Sapphire Rapids, Zen 4 and later).
  // AMX-BF16: leaf 7 subleaf 0, EDX bit 22 (Sapphire Rapids and later; oneDNN asks Linux for the tile state).
  f.amx_bf16 = f.avx512 && ((d >> 22) & 1);
  f.avx512_bf16 = f.avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 5) & 1);
  return f;
}
#else
Features read_features() { return {}; }
#endif

const Features& features() {
  static const Features f = read_features();
  return f;
}

CpuIsa best_supported() {
  if (cpu_isa_supported(CpuIsa::Avx512)) return CpuIsa::Avx512;
  if (cpu_isa_supported(CpuIsa::Avx2)) return CpuIsa::Avx2;
  return CpuIsa::Scalar;
}

CpuIsa initial_isa() {
  if (const char* env = std::getenv("LOOM_CPU_ISA"); env != nullptr && *env != '\0') {
    const CpuIsa isa = parse_cpu_isa(env);
    LOOM_CHECK(cpu_isa_supported(isa), "LOOM_CPU_ISA=", env, ": this CPU cannot run the ", env,
               " kernels (it supports up to ", cpu_isa_name(best_supported()), ")");
    return isa;
  }
  return best_supported();
}

// -1 until the first cpu_isa() call, then the CpuIsa value. An atomic, so that kernels on any thread
// read it without a lock; set_cpu_isa is for tests and benchmarks, between kernel calls.
std::atomic<int> g_isa{-1};

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
  }
  return "?";
}

bool cpu_has_avx512_bf16() { return features().avx512_bf16; }
bool cpu_has_amx_bf16() { return features().amx_bf16; }

bool cpu_isa_supported(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return true;
    case CpuIsa::Avx2: return features().avx2;
    case CpuIsa::Avx512: return features().avx512;
  }
  return false;
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    if (cpu_isa_supported(isa)) out.push_back(isa);
  return out;
}

CpuIsa parse_cpu_isa(const char* text) {
  const std::string s = text != nullptr ? text : "";
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512})
    if (s == cpu_isa_name(isa)) return isa;
  LOOM_FAIL("CPU instruction set '", s, "' is not one of scalar, avx2, avx512");
}

CpuIsa cpu_isa() {
  int v = g_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    // Several threads may race here on first use: they all compute the same value.
    v = static_cast<int>(initial_isa());
    g_isa.store(v, std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(v);
}

void set_cpu_isa(CpuIsa isa) {
  LOOM_CHECK(cpu_isa_supported(isa), "set_cpu_isa: this CPU cannot run the ", cpu_isa_name(isa),
             " kernels (it supports up to ", cpu_isa_name(best_supported()), ")");
  g_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace loom::cpu
