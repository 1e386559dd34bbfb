// f32 -> bf16 conversion: every version this CPU can run (chosen at run time: scalar, AVX2,
// AVX512-BF16) against the scalar oracle bf16::from_float, bitwise, on the cases rounding gets wrong:
// ties to even, carries into the exponent, overflow to inf, NaN payloads, denormals, and every tail length.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/elementwise.h"
#include "core/rng.h"
#include "support/op_test.h"

using namespace loom;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Normal values of every exponent, ties (low half exactly 0x8000, with even and odd kept bit), values
// just either side of a tie, carries (0x..7fff..), the largest finite floats (round to inf), infinities,
// NaNs with payloads in both halves, and (unless skip_denormals) denormals.
std::vector<float> hard_cases(bool denormals) {
  std::vector<float> v;
  RngKey key = RngKey::from_seed(7);
  for (uint32_t i = 0; i < 4000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(random_bits(key, i));
    const uint32_t exponent = (bits >> 23) & 0xff;
    if (!denormals && exponent == 0 && (bits & 0x7fffff) != 0) continue;
    v.push_back(from_bits(bits));  // any bit pattern: NaNs and infinities included
  }
  for (uint32_t top : {0x3f80u, 0x3f81u, 0xbf80u, 0xbf81u, 0x7f7fu, 0xff7fu, 0x0080u, 0x4b7fu}) {
    for (uint32_t low : {0x8000u, 0x7fffu, 0x8001u, 0xffffu, 0x0000u, 0x0001u}) v.push_back(from_bits(top << 16 | low));
  }
  for (float f : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), 0.0f, -0.0f, 1.0f, -1.0f}) {
    v.push_back(f);
  }
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffc00001u, 0x7f810000u}) v.push_back(from_bits(nan));
  if (denormals) {
    for (uint32_t d : {0x00000001u, 0x00008000u, 0x00018000u, 0x007fffffu, 0x807fffffu, 0x00400000u}) v.push_back(from_bits(d));
  }
  return v;
}

std::vector<cpu::ConvertIsa> available() {
  std::vector<cpu::ConvertIsa> out;
  for (auto isa : {cpu::ConvertIsa::Scalar, cpu::ConvertIsa::Avx2, cpu::ConvertIsa::Avx512Bf16}) {
    if (cpu::convert_isa_available(isa)) out.push_back(isa);
  }
  return out;
}

}  // namespace

TEST(ConvertBf16, EveryVersionMatchesTheScalarRoundingBitwise) {
  for (cpu::ConvertIsa isa : available()) {
    // The AVX512-BF16 instruction treats denormal inputs as zero; the others keep them.
    const std::vector<float> in = hard_cases(isa != cpu::ConvertIsa::Avx512Bf16);
    // Every length from 0 to 40 (the 16- and 8-wide loops and the scalar tail), then all of it.
    std::vector<size_t> lengths;
    for (size_t n = 0; n <= 40; ++n) lengths.push_back(n);
    lengths.push_back(in.size());
    for (size_t n : lengths) {
      std::vector<bf16> got(n + 1, bf16{0x5555});
      cpu::convert_f32_to_bf16_with(isa, in.data(), got.data(), static_cast<int64_t>(n));
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i].bits, bf16::from_float(in[i]).bits)
            << cpu::convert_isa_name(isa) << " n=" << n << " i=" << i << " input bits 0x" << std::hex
            << [&] { uint32_t u; std::memcpy(&u, &in[i], 4); return u; }();
      }
      EXPECT_EQ(got[n].bits, 0x5555) << cpu::convert_isa_name(isa) << " wrote past the end at n=" << n;
    }
  }
}

TEST(ConvertBf16, TheDispatchedThreadedVersionMatchesTheOneItNames) {
  // Large enough to be split over threads; no denormals so that every version agrees.
  std::vector<float> in;
  const std::vector<float> cases = hard_cases(false);
  while (in.size() < 200000) in.insert(in.end(), cases.begin(), cases.end());
  std::vector<bf16> threaded(in.size()), serial(in.size()), reference(in.size());
  const cpu::ConvertStats before = cpu::convert_stats();
  cpu::convert_f32_to_bf16(in.data(), threaded.data(), static_cast<int64_t>(in.size()));
  const cpu::ConvertStats after = cpu::convert_stats();
  EXPECT_EQ(after.passes - before.passes, 1);
  EXPECT_EQ(after.elements - before.elements, static_cast<int64_t>(in.size()));
  cpu::convert_f32_to_bf16_serial(in.data(), serial.data(), static_cast<int64_t>(in.size()));
  cpu::convert_f32_to_bf16_with(cpu::active_convert_isa(), in.data(), reference.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(threaded[i].bits, bf16::from_float(in[i]).bits) << i;
    ASSERT_EQ(serial[i].bits, threaded[i].bits) << i;
    ASSERT_EQ(reference[i].bits, threaded[i].bits) << i;
  }
  // This machine's choice, for the log: a CPU with AVX2 must not fall back to the scalar loop.
  std::printf("convert_f32_to_bf16 uses %s\n", cpu::convert_isa_name(cpu::active_convert_isa()));
  if (cpu::convert_isa_available(cpu::ConvertIsa::Avx2)) {
    EXPECT_NE(cpu::active_convert_isa(), cpu::ConvertIsa::Scalar);
  }
}

TEST(ConvertBf16, AskingForAnIsaTheCpuLacksIsAnError) {
  for (auto isa : {cpu::ConvertIsa::Avx2, cpu::ConvertIsa::Avx512Bf16}) {
    if (cpu::convert_isa_available(isa)) continue;
    float x = 1.0f;
    bf16 y;
    try {
      cpu::convert_f32_to_bf16_with(isa, &x, &y, 1);
      FAIL() << cpu::convert_isa_name(isa);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cpu::convert_isa_name(isa)), std::string::npos) << e.what();
    }
  }
}
