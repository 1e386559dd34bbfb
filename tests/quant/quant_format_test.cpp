// The GGUF block formats: every type's dequantizer and every writable type's quantizer against the
// gguf package's (fixtures/quant_cases.bin, made by make_quant_fixtures.py), the half-precision
// conversions exhaustively, and malformed sizes and unknown types refused by name.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "quant/quant.h"

using namespace loom;
using namespace loom::quant;

namespace {

struct Case {
  std::string name;
  QuantType type;
  uint32_t kind;  // 0: bytes -> floats (dequantize); 1: floats -> bytes (quantize)
  std::vector<uint8_t> bytes;
  std::vector<float> floats;
};

std::vector<Case> load_cases() {
  const std::string path = std::string(LOOM_TEST_DIR) + "/fixtures/quant_cases.bin";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  auto read = [&](void* p, size_t n) { in.read(static_cast<char*>(p), static_cast<std::streamsize>(n)); };
  char magic[4];
  read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), "LQF1");
  uint32_t count = 0;
  read(&count, 4);
  std::vector<Case> cases;
  for (uint32_t c = 0; c < count && in.good(); ++c) {
    Case k;
    uint32_t name_len, type_id;
    uint64_t n, nbytes;
    read(&name_len, 4);
    k.name.resize(name_len);
    read(k.name.data(), name_len);
    read(&type_id, 4);
    read(&k.kind, 4);
    read(&n, 8);
    read(&nbytes, 8);
    k.type = quant_type_from_id(type_id);
    k.bytes.resize(nbytes);
    read(k.bytes.data(), nbytes);
    k.floats.resize(n);
    read(k.floats.data(), n * 4);
    cases.push_back(std::move(k));
  }
  EXPECT_TRUE(in.good()) << path << " is truncated";
  return cases;
}

// Bitwise equality, except that any NaN equals any NaN (payloads are not part of the formats' contract).
void expect_same_floats(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int mismatches = 0;
  for (size_t i = 0; i < got.size() && mismatches < 5; ++i) {
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) ||
                      std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want[i]);
    if (!same) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", gguf gives " << want[i];
      ++mismatches;
    }
  }
}

}  // namespace

TEST(QuantFormat, EveryTypeDecodesLikeTheGgufPackage) {
  const std::vector<Case> cases = load_cases();
  std::vector<std::string> seen;
  for (const Case& c : cases) {
    if (c.kind != 0) continue;
    SCOPED_TRACE(c.name);
    const int64_t n = static_cast<int64_t>(c.floats.size());
    ASSERT_EQ(row_bytes(c.type, n), static_cast<int64_t>(c.bytes.size()));
    std::vector<float> out(c.floats.size(), -1.0f);
    dequantize(c.type, c.bytes.data(), n, out.data());
    expect_same_floats(out, c.floats, c.name);
    seen.push_back(quant_type_name(c.type));
  }
  // Every type the contract promises is covered by a fixture.
  for (const char* t : {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K"}) {
    EXPECT_NE(std::find(seen.begin(), seen.end(), t), seen.end()) << "no dequantize fixture for " << t;
  }
}

TEST(QuantFormat, QuantizersAreBitExactWithTheGgufPackage) {
  const std::vector<Case> cases = load_cases();
  int checked = 0;
  for (const Case& c : cases) {
    if (c.kind != 1) continue;
    SCOPED_TRACE(c.name);
    const int64_t n = static_cast<int64_t>(c.floats.size());
    std::vector<uint8_t> out(static_cast<size_t>(row_bytes(c.type, n)), 0xAB);
    quantize(c.type, c.floats.data(), n, out.data());
    ASSERT_EQ(out.size(), c.bytes.size());
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(out[i], c.bytes[i]) << c.name << ": byte " << i << " (block " << i / block_bytes(c.type) << ")";
    }
    ++checked;
  }
  EXPECT_EQ(checked, 6);  // F32, F16, BF16, Q8_0, Q4_0, Q4_1
}

// Quantize-then-dequantize lands within the format's grid: half a step for the rounding quantizers
// (Q8_0 rounds to nearest; Q4_1 adds 0.5 before truncating), plus the f16 rounding of the scale.
// Q4_0's grid is [-8, 7] steps with the largest magnitude at -8, so values of the other sign beyond
// 7 steps are clipped: up to a whole step off.
TEST(QuantFormat, RoundTripErrorIsWithinHalfAStep) {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 32 * 64;
  std::vector<float> x(n), y(n);
  for (float& v : x) v = normal(gen);
  for (QuantType t : {QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1}) {
    SCOPED_TRACE(quant_type_name(t));
    std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, n)));
    quantize(t, x.data(), n, q.data());
    dequantize(t, q.data(), n, y.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float lo = x[b * 32], hi = lo, amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      const float step = t == QuantType::Q8_0 ? amax / 127 : t == QuantType::Q4_0 ? amax / 8 : (hi - lo) / 15;
      // f16 scale: relative error 2^-11 on d, times up to 16 (or 127) steps; f16 min: 2^-11 of |min|.
      const float slack = step * (t == QuantType::Q8_0 ? 127.0f : 16.0f) * 0x1p-11f + std::fabs(lo) * 0x1p-11f;
      for (int j = 0; j < 32; ++j) {
        const float half = t == QuantType::Q4_0 ? 1.0f : 0.5f;
        ASSERT_LE(std::fabs(y[b * 32 + j] - x[b * 32 + j]), half * step + slack + 1e-7f) << "block " << b << " j " << j;
      }
    }
  }
}

TEST(QuantFormat, HalfPrecisionRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) << h;
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << "f16 bits " << h << " = " << f;
  }
}

#if defined(__F16C__)
// f32 -> f16 agrees with the CPU's own conversion (vcvtps2ph, round to nearest even) on random bit
// patterns: every exponent, so subnormal results, ties and overflow are all hit.
TEST(QuantFormat, HalfPrecisionRoundsLikeF16c) {
  std::mt19937 gen(11);
  for (int i = 0; i < 1 << 20; ++i) {
    const uint32_t bits = static_cast<uint32_t>(gen());
    const float f = std::bit_cast<float>(bits);
    const uint16_t hw = static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    ASSERT_EQ(f32_to_f16(f), hw) << "f32 bits 0x" << std::hex << bits;
  }
}
#endif

TEST(QuantFormat, SizesAndTypesAreChecked) {
  EXPECT_EQ(row_bytes(QuantType::Q4_1, 576), 18 * 20);
  EXPECT_EQ(row_bytes(QuantType::Q6_K, 512), 2 * 210);
  EXPECT_EQ(row_bytes(QuantType::BF16, 3), 6);
  try {
    row_bytes(QuantType::Q4_1, 33);
    FAIL() << "33 elements of Q4_1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("33 elements"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("block size 32"), std::string::npos) << e.what();
  }
  try {
    std::vector<float> out(300);
    std::vector<uint8_t> in(300);
    dequantize(QuantType::Q4_K, in.data(), 300, out.data());
    FAIL() << "300 elements of Q4_K accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q4_K: 300 elements"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
  EXPECT_THROW(row_bytes(QuantType::Q8_0, -32), Error);

  EXPECT_EQ(quant_type_from_id(3), QuantType::Q4_1);
  EXPECT_EQ(quant_type_from_id(30), QuantType::BF16);
  try {
    quant_type_from_id(10);
    FAIL() << "Q2_K accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q2_K (ggml type id 10) is not supported"), std::string::npos) << e.what();
  }
  try {
    quant_type_from_id(77);
    FAIL() << "type 77 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown ggml tensor type id 77"), std::string::npos) << e.what();
  }
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> out(256);
  try {
    quantize(QuantType::Q4_K, x.data(), 256, out.data());
    FAIL() << "Q4_K quantize accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not write Q4_K"), std::string::npos) << e.what();
  }
}
