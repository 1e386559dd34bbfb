// quantized_matmul: every kernel path (scalar, AVX2, AVX-512 VNNI, AMX where the CPU has it) against the
// double-precision oracle that uses the same activation quantization, the oracle against the exact
// f32 product within the activation-rounding bound stated in qmatmul.h, the activation quantizer
// identical on every path, thread-count independence, the AMX path bitwise the VNNI path, and refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "quant/qmatmul.h"

using namespace loom;
using namespace loom::quant;

namespace {

const KernelPath kPaths[] = {KernelPath::Scalar, KernelPath::Avx2, KernelPath::Avx512Vnni, KernelPath::Amx};
const ActivationRounding kRoundings[] = {ActivationRounding::Int8, ActivationRounding::Int8x2};
const QuantType kTypes[] = {QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1, QuantType::Q4_K, QuantType::Q6_K};

// Random block bytes (every bit pattern of the quants, -128 included for Q8_0) with finite f16 scales of
// about 0.02 in the scale fields.
QuantizedMatrix random_matrix(QuantType type, int64_t rows, int64_t cols, std::mt19937& gen) {
  const int64_t rb = row_bytes(type, cols), bb = block_bytes(type);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * rb));
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(gen());
  std::normal_distribution<float> scale(0.0f, 0.02f);
  std::vector<int> scale_offsets;
  switch (type) {
    case QuantType::Q4_1: case QuantType::Q4_K: scale_offsets = {0, 2}; break;
    case QuantType::Q6_K: scale_offsets = {208}; break;
    default: scale_offsets = {0}; break;
  }
  for (int64_t blk = 0; blk < rows * rb / bb; ++blk) {
    for (int off : scale_offsets) {
      const uint16_t h = f32_to_f16(scale(gen));
      std::memcpy(&bytes[static_cast<size_t>(blk * bb + off)], &h, 2);
    }
  }
  return QuantizedMatrix(type, rows, cols, bytes.data());
}

std::vector<float> random_activations(int64_t M, int64_t K, std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (float& v : x) v = normal(gen);
  // Activations of real models have outlier channels; give a few blocks one.
  for (int64_t i = 0; i < M * K; i += 97) x[static_cast<size_t>(i)] *= 20.0f;
  return x;
}

struct Case {
  QuantType type;
  int64_t M, N, K;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (QuantType t : kTypes) {
    const bool k_quant = block_elements(t) == 256;
    // M: decode (1), a remainder after groups of 4 (7), and two full groups (8); N crosses the 16-row
    // blocks; K an odd number of blocks for the 32-block formats.
    out.push_back({t, 1, 37, k_quant ? 256 : 96});
    out.push_back({t, 7, 50, k_quant ? 512 : 160});
    out.push_back({t, 8, 33, k_quant ? 768 : 576});
  }
  return out;
}

std::string label(const Case& c) {
  return std::string(quant_type_name(c.type)) + " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
         " K=" + std::to_string(c.K);
}

}  // namespace

// All paths compute the oracle's integer block sums; only the f32 accumulation order differs, so they
// agree with it to ~1e-6 of the magnitude sum_k |W x|.
TEST(QuantizedMatmul, EveryPathMatchesTheOracle) {
  std::mt19937 gen(3);
  int paths_run = 0;
  for (KernelPath path : kPaths) {
    if (!kernel_path_supported(path)) {
      std::printf("[   INFO   ] %s kernels: not supported by this CPU, skipped\n", kernel_path_name(path));
      continue;
    }
    ++paths_run;
    for (const Case& c : cases()) for (ActivationRounding rounding : kRoundings) {
      SCOPED_TRACE(std::string(kernel_path_name(path)) + " " + activation_rounding_name(rounding) + " " + label(c));
      const QuantizedMatrix w = random_matrix(c.type, c.N, c.K, gen);
      const std::vector<float> x = random_activations(c.M, c.K, gen);
      std::vector<float> y(static_cast<size_t>(c.M * c.N)), ref(y.size()), wf(static_cast<size_t>(c.N * c.K));
      quantized_matmul(x.data(), c.M, w, y.data(), path, rounding);
      quantized_matmul_reference(x.data(), c.M, w, ref.data(), rounding);
      w.dequantize(wf.data());
      for (int64_t m = 0; m < c.M; ++m) {
        for (int64_t n = 0; n < c.N; ++n) {
          double mag = 0;
          for (int64_t k = 0; k < c.K; ++k) mag += std::fabs(static_cast<double>(wf[n * c.K + k]) * x[m * c.K + k]);
          ASSERT_NEAR(y[m * c.N + n], ref[m * c.N + n], 2e-6 * mag + 1e-30) << "m " << m << " n " << n;
        }
      }
    }
  }
  EXPECT_GE(paths_run, 1);
}

// Int8x2's per-element bound (qmatmul.h): level 0 leaves r = x - d q with |r| <= d/2; level 1 rounds r at
// the fixed step d/256, so x is off by at most d/512, except where |r| > 127.5 d/256 and q' clamps to
// +-127: there by at most d/2 - 127 d/256 = d/256. The slack is f32's: t = fl(r * (256/d)) is within
// ~3e-5 of r / (d/256) (two roundings of a value <= 128), so 1e-4 of d/512; a clamped element also carries
// |r| <= d (1/2 + ~1.6e-5) (fl(x * (1/d)) rounded before q), 0.4% of d/256.
double int8x2_element_bound(const ActBlock& level0, const ActBlock& level1, int j) {
  const double d = level0.d;
  return std::abs(level1.q[j]) == 127 ? d / 256.0 * (1 + 1e-2) : d / 512.0 * (1 + 1e-4);
}

// The oracle against the exact product. Int8: each activation is off by at most d_b/2 after rounding, so
// |y - x W^T| <= sum_b (d_b / 2) sum_{k in b} |W[n,k]| (d_b = max|x| over the block / 127), plus f32
// rounding of the dequantized weights' products. Int8x2: the same sum with each element's own bound
// (int8x2_element_bound: d/512, d/256 where level 1 clamps). Also checks that each bound is not vacuous:
// the observed error reaches a sizeable fraction of it somewhere.
TEST(QuantizedMatmul, ActivationRoundingIsWithinTheStatedBound) {
  for (ActivationRounding rounding : kRoundings) {
    SCOPED_TRACE(activation_rounding_name(rounding));
    std::mt19937 gen(5);
    double worst_fraction = 0;
    for (const Case& c : cases()) {
      SCOPED_TRACE(label(c));
      const QuantizedMatrix w = random_matrix(c.type, c.N, c.K, gen);
      const std::vector<float> x = random_activations(c.M, c.K, gen);
      std::vector<float> ref(static_cast<size_t>(c.M * c.N)), wf(static_cast<size_t>(c.N * c.K));
      quantized_matmul_reference(x.data(), c.M, w, ref.data(), rounding);
      w.dequantize(wf.data());
      const int64_t nb = c.K / 32;
      std::vector<ActBlock> a(static_cast<size_t>(2 * c.M * nb));
      quantize_activations(x.data(), c.M, c.K, a.data(), KernelPath::Scalar, ActivationRounding::Int8x2);
      for (int64_t m = 0; m < c.M; ++m) {
        for (int64_t n = 0; n < c.N; ++n) {
          double exact = 0, bound = 0, mag = 0;
          for (int64_t b = 0; b < nb; ++b) {
            const ActBlock& l0 = a[static_cast<size_t>(2 * m * nb + b)];
            const ActBlock& l1 = a[static_cast<size_t>((2 * m + 1) * nb + b)];
            double amax = 0, wsum = 0;
            for (int64_t k = 32 * b; k < 32 * b + 32; ++k) {
              const double wk = wf[n * c.K + k], xk = x[m * c.K + k];
              exact += wk * xk;
              mag += std::fabs(wk * xk);
              amax = std::max(amax, std::fabs(xk));
              wsum += std::fabs(wk);
              if (rounding == ActivationRounding::Int8x2) bound += std::fabs(wk) * int8x2_element_bound(l0, l1, k % 32);
            }
            if (rounding == ActivationRounding::Int8) bound += amax / 127.0 / 2.0 * wsum * (1 + 1e-4);
          }
          const double err = std::fabs(ref[m * c.N + n] - exact);
          ASSERT_LE(err, bound + 1e-6 * mag) << "m " << m << " n " << n;
          worst_fraction = std::max(worst_fraction, err / bound);
        }
      }
    }
    EXPECT_GT(worst_fraction, 0.05) << "the rounding error never came near the bound: is the oracle quantizing?";
  }
}

// Int8x2 element by element: x against d q + (d/256) q' within int8x2_element_bound, the bound reached
// (a residual rounded any coarser, or truncated, breaks it), and level 1's fields: d' = d / 256 exactly,
// s' = d' (256 sum q + sum q') exactly (the token's offset sum, which the kernels use for both levels),
// the 16-element sums its own.
TEST(QuantizedMatmul, Int8x2RoundsEachActivationWithinDOver512) {
  std::mt19937 gen(37);
  const int64_t M = 16, K = 32 * 24, nb = K / 32;
  const std::vector<float> x = random_activations(M, K, gen);
  std::vector<ActBlock> a(static_cast<size_t>(2 * M * nb));
  quantize_activations(x.data(), M, K, a.data(), KernelPath::Scalar, ActivationRounding::Int8x2);
  double worst = 0, worst_clamped = 0;
  int clamped = 0;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const ActBlock& l0 = a[static_cast<size_t>(2 * m * nb + b)];
      const ActBlock& l1 = a[static_cast<size_t>((2 * m + 1) * nb + b)];
      ASSERT_EQ(l1.d, l0.d / 256.0f) << m << " " << b;
      int sum0 = 0, sum1[2] = {0, 0};
      for (int j = 0; j < 32; ++j) {
        const double xk = x[static_cast<size_t>(m * K + 32 * b + j)];
        const double err = std::fabs(xk - (static_cast<double>(l0.d) * l0.q[j] + static_cast<double>(l1.d) * l1.q[j]));
        ASSERT_LE(err, int8x2_element_bound(l0, l1, j)) << m << " " << b << " " << j;
        ASSERT_LE(std::abs(l1.q[j]), 127);
        const bool clamp = std::fabs(xk - static_cast<double>(l0.d) * l0.q[j]) > 127.5 * l1.d;
        clamped += clamp;
        (clamp ? worst_clamped : worst) = std::max(clamp ? worst_clamped : worst, err / (l0.d / (clamp ? 256.0 : 512.0)));
        sum0 += l0.q[j];
        sum1[j / 16] += l1.q[j];
      }
      EXPECT_EQ(l1.s, l1.d * static_cast<float>(256 * sum0 + sum1[0] + sum1[1])) << m << " " << b;
      EXPECT_EQ(l1.sum16[0], sum1[0]);
      EXPECT_EQ(l1.sum16[1], sum1[1]);
      // The Q8_0 pair kernels' bias: 128 sum(q), and on level 1 the levels' combined.
      EXPECT_EQ(l0.q8_bias, 128 * sum0) << m << " " << b;
      EXPECT_EQ(l1.q8_bias, 256 * 128 * sum0 + 128 * (sum1[0] + sum1[1])) << m << " " << b;
    }
  }
  EXPECT_GT(worst, 0.99) << "no residual came near half a step of d/256";
  EXPECT_GT(clamped, 0) << "no residual reached the clamp (|r| > 127.5 d/256)";
  EXPECT_GT(worst_clamped, 0.5);
}

// What Int8x2 is for: on the same products its error against the exact (dequantized-f32) result is a
// small fraction of Int8's, on every path.
TEST(QuantizedMatmul, TwoLevelRoundingIsFarCloserToTheF32Product) {
  std::mt19937 gen(21);
  for (KernelPath path : kPaths) {
    if (!kernel_path_supported(path)) continue;
    SCOPED_TRACE(kernel_path_name(path));
    for (const Case& c : cases()) {
      const QuantizedMatrix w = random_matrix(c.type, c.N, c.K, gen);
      const std::vector<float> x = random_activations(c.M, c.K, gen);
      std::vector<float> y8(static_cast<size_t>(c.M * c.N)), y16(y8.size()), wf(static_cast<size_t>(c.N * c.K));
      quantized_matmul(x.data(), c.M, w, y8.data(), path, ActivationRounding::Int8);
      quantized_matmul(x.data(), c.M, w, y16.data(), path, ActivationRounding::Int8x2);
      w.dequantize(wf.data());
      double err8 = 0, err16 = 0;
      for (int64_t m = 0; m < c.M; ++m) {
        for (int64_t n = 0; n < c.N; ++n) {
          double exact = 0;
          for (int64_t k = 0; k < c.K; ++k) exact += static_cast<double>(wf[n * c.K + k]) * x[m * c.K + k];
          err8 += std::fabs(y8[m * c.N + n] - exact);
          err16 += std::fabs(y16[m * c.N + n] - exact);
        }
      }
      EXPECT_LT(err16, err8 / 50) << label(c) << ": int8 " << err8 << ", int8x2 " << err16;
    }
  }
}

// Every path's activation quantizer produces the same blocks (so the integer sums are the same):
// random rows, exact ties (round half to even), zeros, and blocks holding inf / NaN.
TEST(QuantizedMatmul, ActivationQuantizerIsIdenticalOnEveryPath) {
  std::mt19937 gen(9);
  const int64_t M = 3, K = 32 * 6;
  std::vector<float> x = random_activations(M, K, gen);
  for (int j = 0; j < 32; ++j) x[32 + j] = static_cast<float>(j - 16) + 0.5f;  // block 1: d = 1 after...
  x[32] = 127.0f;                                                                // ...this max: every value a tie
  for (int j = 0; j < 32; ++j) x[64 + j] = 0.0f;
  x[96 + 3] = INFINITY;
  x[128 + 30] = NAN;
  // Block 5: d = 1 again, q = j - 16, and residuals that are ties of Int8x2's level 1 (steps of 1/256).
  for (int j = 0; j < 32; ++j) x[160 + j] = static_cast<float>(j - 16) + (static_cast<float>(j - 16) + 0.5f) / 256.0f;
  x[160] = 127.0f;
  std::vector<ActBlock> scalar(static_cast<size_t>(M * K / 32)), other(scalar.size());
  quantize_activations(x.data(), M, K, scalar.data(), KernelPath::Scalar, ActivationRounding::Int8);
  // Ties went to even: 0.5 -> 0, 1.5 -> 2, -0.5 -> 0, -1.5 -> -2.
  EXPECT_EQ(scalar[1].d, 1.0f);
  EXPECT_EQ(scalar[1].q[16], 0);   // 0.5
  EXPECT_EQ(scalar[1].q[17], 2);   // 1.5
  EXPECT_EQ(scalar[1].q[15], 0);   // -0.5
  EXPECT_EQ(scalar[1].q[14], -2);  // -1.5
  EXPECT_EQ(scalar[2].d, 0.0f);
  EXPECT_TRUE(std::isnan(scalar[3].d));
  EXPECT_TRUE(std::isnan(scalar[4].d));
  for (KernelPath path : kPaths) {
    if (path == KernelPath::Scalar || !kernel_path_supported(path)) continue;
    SCOPED_TRACE(kernel_path_name(path));
    quantize_activations(x.data(), M, K, other.data(), path, ActivationRounding::Int8);
    for (size_t b = 0; b < scalar.size(); ++b) {
      EXPECT_EQ(std::memcmp(&scalar[b], &other[b], sizeof(ActBlock)), 0) << "block " << b;
    }
  }
  // Int8x2: row m's level 0 is Int8's row m, level 1 the residual's blocks at d / 256; the same bytes on
  // every path.
  const int64_t nb = K / 32;
  std::vector<ActBlock> scalar2(static_cast<size_t>(2 * M * nb)), other2(scalar2.size());
  quantize_activations(x.data(), M, K, scalar2.data(), KernelPath::Scalar, ActivationRounding::Int8x2);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      EXPECT_EQ(std::memcmp(&scalar2[(2 * m) * nb + b], &scalar[m * nb + b], sizeof(ActBlock)), 0) << m << " " << b;
      const ActBlock& lo = scalar2[(2 * m + 1) * nb + b];
      if (std::isfinite(scalar[m * nb + b].d)) {
        EXPECT_EQ(lo.d, scalar[m * nb + b].d / 256.0f) << m << " " << b;
      } else {
        EXPECT_TRUE(std::isnan(lo.d) && std::isnan(lo.s)) << m << " " << b;
      }
    }
  }
  // Row 0, level 1: block 1's ties leave residuals of exactly +-0.5 = +-128 steps of 1/256, clamped to
  // +-127; block 5's residuals are exact ties of level 1's step, (j - 16 + 0.5) / 256, rounded to even;
  // block 2 is all zeros.
  EXPECT_EQ(scalar2[nb + 1].d, 1.0f / 256.0f);
  EXPECT_EQ(scalar2[nb + 1].q[16], 127);   // 0.5
  EXPECT_EQ(scalar2[nb + 1].q[15], -127);  // -0.5
  EXPECT_EQ(scalar2[nb + 5].d, 1.0f / 256.0f);
  EXPECT_EQ(scalar2[nb + 5].q[16], 0);   // 0.5 steps
  EXPECT_EQ(scalar2[nb + 5].q[17], 2);   // 1.5
  EXPECT_EQ(scalar2[nb + 5].q[18], 2);   // 2.5
  EXPECT_EQ(scalar2[nb + 5].q[15], 0);   // -0.5
  EXPECT_EQ(scalar2[nb + 5].q[14], -2);  // -1.5
  EXPECT_EQ(scalar2[nb + 2].d, 0.0f);
  for (KernelPath path : kPaths) {
    if (path == KernelPath::Scalar || !kernel_path_supported(path)) continue;
    SCOPED_TRACE(kernel_path_name(path));
    quantize_activations(x.data(), M, K, other2.data(), path, ActivationRounding::Int8x2);
    for (size_t b = 0; b < scalar2.size(); ++b) {
      EXPECT_EQ(std::memcmp(&scalar2[b], &other2[b], sizeof(ActBlock)), 0) << "block " << b;
    }
  }
}

TEST(QuantizedMatmul, NonFiniteActivationsGiveNaN) {
  std::mt19937 gen(13);
  const QuantizedMatrix w = random_matrix(QuantType::Q4_1, 20, 64, gen);
  std::vector<float> x = random_activations(2, 64, gen);
  x[5] = INFINITY;  // row 0 only
  std::vector<float> y(40);
  for (KernelPath path : kPaths) {
    if (!kernel_path_supported(path)) continue;
    for (ActivationRounding rounding : kRoundings) {
      quantized_matmul(x.data(), 2, w, y.data(), path, rounding);
      for (int n = 0; n < 20; ++n) {
        EXPECT_TRUE(std::isnan(y[n])) << kernel_path_name(path) << " n " << n;
        EXPECT_TRUE(std::isfinite(y[20 + n])) << kernel_path_name(path) << " n " << n;
      }
    }
  }
}

TEST(QuantizedMatmul, ResultsDoNotDependOnTheThreadCount) {
  std::mt19937 gen(17);
  const int saved = num_threads();
  const QuantizedMatrix w = random_matrix(QuantType::Q4_1, 301, 256, gen);
  const std::vector<float> x = random_activations(6, 256, gen);
  for (ActivationRounding rounding : kRoundings) {
    std::vector<float> y1(6 * 301), y3(y1.size());
    set_num_threads(1);
    quantized_matmul(x.data(), 6, w, y1.data(), KernelPath::Auto, rounding);
    set_num_threads(3);
    quantized_matmul(x.data(), 6, w, y3.data(), KernelPath::Auto, rounding);
    set_num_threads(saved);
    EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * 4), 0) << activation_rounding_name(rounding);
  }
}

// A row's result does not depend on the other rows beside it (a batch of tokens, or Int8x2's second
// level taking the R = 2 tiles), nor on whether it goes through quantized_matmul or one thread's
// quantized_matmul_rows (the fused decode step's entry), on every path. 19 rows: the AVX-512 pair
// kernels take 8 tokens a pass, then 2 and 1 (from 16 activation rows on; a lone row takes the 8-row
// groups), the AMX tiles 16 activation rows and a padded remainder.
// Batches of 13 and 15 take the AVX-512 kernels' 16-token pass with the last token repeated in the
// empty places, 19 a pass of 16 and then 2 + 1, 28 a pass of 16 and a padded one (kernels_x86.inc,
// pair_passes).
TEST(QuantizedMatmul, EachRowIsTheSameAloneOrInABatch) {
  std::mt19937 gen(23);
  for (QuantType type : kTypes) {
    for (int64_t M : {13, 15, 19, 28}) {
      SCOPED_TRACE("M = " + std::to_string(M));
      const int64_t K = block_elements(type) == 256 ? 512 : 192, N = 72;
      const QuantizedMatrix w = random_matrix(type, N, K, gen);
      const std::vector<float> x = random_activations(M, K, gen);
      for (KernelPath path : kPaths) {
        if (!kernel_path_supported(path)) continue;
        for (ActivationRounding rounding : kRoundings) {
          SCOPED_TRACE(std::string(quant_type_name(type)) + " " + kernel_path_name(path) + " " +
                       activation_rounding_name(rounding));
          std::vector<float> batch(static_cast<size_t>(M * N));
          quantized_matmul(x.data(), M, w, batch.data(), path, rounding);
          const int64_t levels = activation_levels(rounding);
          std::vector<ActBlock> a(static_cast<size_t>(levels * K / 32));
          for (int64_t m = 0; m < M; ++m) {
            std::vector<float> alone(static_cast<size_t>(N)), rows(alone.size());
            quantized_matmul(x.data() + m * K, 1, w, alone.data(), path, rounding);
            quantize_activation_rows(x.data() + m * K, 1, K, a.data(), path, rounding);
            quantized_matmul_rows(a.data(), 1, w, 0, N, rows.data(), 0, path, rounding);
            EXPECT_EQ(std::memcmp(alone.data(), batch.data() + m * N, N * 4), 0) << "row " << m;
            EXPECT_EQ(std::memcmp(rows.data(), alone.data(), N * 4), 0) << "row " << m;
          }
        }
      }
    }
  }
}

// A row's result does not depend on where a thread's share starts: shares starting at 8 rows pair the
// 8-row groups otherwise than whole-matrix calls do (the AVX-512 kernels take two groups at a time), and
// 1, 2, 3 or 5 activation rows take each of the kernels' row counts. Bitwise on every path.
TEST(QuantizedMatmul, EachOutputIsTheSameWhateverShareComputesIt) {
  std::mt19937 gen(29);
  for (QuantType type : kTypes) {
    const int64_t K = block_elements(type) == 256 ? 512 : 192, N = 88;
    const QuantizedMatrix w = random_matrix(type, N, K, gen);
    for (int64_t M : {1, 2, 3, 5}) {
      const std::vector<float> x = random_activations(M, K, gen);
      for (KernelPath path : kPaths) {
        if (!kernel_path_supported(path)) continue;
        for (ActivationRounding rounding : kRoundings) {
          SCOPED_TRACE(std::string(quant_type_name(type)) + " " + kernel_path_name(path) + " " +
                       activation_rounding_name(rounding) + " M=" + std::to_string(M));
          const int64_t levels = activation_levels(rounding);
          std::vector<ActBlock> a(static_cast<size_t>(M * levels * K / 32));
          quantize_activation_rows(x.data(), M, K, a.data(), path, rounding);
          std::vector<float> whole(static_cast<size_t>(M * N)), parts(whole.size());
          quantized_matmul_rows(a.data(), M, w, 0, N, whole.data(), N, path, rounding);
          for (int64_t n0 : {0, 8, 24, 56, 80}) {  // [0, 8), [8, 24), [24, 56), [56, 80), [80, 88)
            const int64_t n1 = n0 == 0 ? 8 : n0 == 8 ? 24 : n0 == 24 ? 56 : n0 == 56 ? 80 : N;
            quantized_matmul_rows(a.data(), M, w, n0, n1, parts.data(), N, path, rounding);
          }
          EXPECT_EQ(std::memcmp(whole.data(), parts.data(), whole.size() * 4), 0);
          if (path != KernelPath::Scalar) {
            std::vector<float> with_path(whole.size());
            quantized_matmul(x.data(), M, w, with_path.data(), path, rounding);
            EXPECT_EQ(std::memcmp(whole.data(), with_path.data(), whole.size() * 4), 0);
          }
        }
      }
    }
  }
}

// The AMX path computes the 16-row pair groups' integer dots with int8 tiles (from a few activation
// rows on) and must give the AVX-512 VNNI path's bits for every row: 1..33 activation rows (below the
// tiles' threshold, partial tiles of 16, one and two full tiles, two and a row), N odd (pairs of groups,
// a lone 8-row group, rows outside the groups), K an odd number of blocks and a single block, each
// rounding; whole calls and shares that start on a lone group; and with the activation tiles copied
// by pack_activation_tiles (in two pieces, as the threads that quantize the rows copy them, the
// padding rows of the last 16 left as garbage, which no kept output may read).
TEST(QuantizedMatmul, AmxIsBitwiseTheVnniPath) {
  if (!kernel_path_supported(KernelPath::Amx)) {
    GTEST_SKIP() << "amx kernels: not supported by this CPU (needs amx-tile, amx-int8 and the OS's tile state)";
  }
  std::mt19937 gen(31);
  for (QuantType type : kTypes) {
    const bool k_quant = block_elements(type) == 256;
    const std::pair<int64_t, int64_t> shapes[] = {{53, k_quant ? 768 : 160}, {41, k_quant ? 256 : 32}};
    for (const auto& [N, K] : shapes) {
      const QuantizedMatrix w = random_matrix(type, N, K, gen);
      const std::vector<float> x = random_activations(33, K, gen);
      for (ActivationRounding rounding : kRoundings) {
        const int64_t levels = activation_levels(rounding);
        std::vector<ActBlock> a(static_cast<size_t>(33 * levels * K / 32));
        quantize_activation_rows(x.data(), 33, K, a.data(), KernelPath::Avx512Vnni, rounding);
        for (int64_t M = 1; M <= 33; ++M) {
          SCOPED_TRACE(std::string(quant_type_name(type)) + " " + activation_rounding_name(rounding) + " M=" +
                       std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
          std::vector<float> vnni(static_cast<size_t>(M * N)), amx(vnni.size(), -1.0f), shares(vnni.size(), -1.0f);
          std::vector<float> tiled(vnni.size(), -1.0f);
          quantized_matmul_rows(a.data(), M, w, 0, N, vnni.data(), N, KernelPath::Avx512Vnni, rounding);
          quantized_matmul_rows(a.data(), M, w, 0, N, amx.data(), N, KernelPath::Amx, rounding);
          const std::pair<int64_t, int64_t> parts[] = {{0, 8}, {8, 40}, {40, N}};
          for (const auto& [n0, n1] : parts) {
            quantized_matmul_rows(a.data(), M, w, n0, n1, shares.data(), N, KernelPath::Amx, rounding);
          }
          const int64_t rows = M * levels;
          std::vector<int8_t> tiles(static_cast<size_t>(activation_tile_bytes(rows, K)), 0x7f);
          pack_activation_tiles(a.data(), 0, rows / 2, K, tiles.data());
          pack_activation_tiles(a.data(), rows / 2, rows, K, tiles.data());
          quantized_matmul_rows(a.data(), M, w, 0, N, tiled.data(), N, KernelPath::Amx, rounding, tiles.data());
          ASSERT_EQ(std::memcmp(vnni.data(), amx.data(), vnni.size() * 4), 0);
          ASSERT_EQ(std::memcmp(vnni.data(), shares.data(), vnni.size() * 4), 0);
          ASSERT_EQ(std::memcmp(vnni.data(), tiled.data(), vnni.size() * 4), 0);
        }
        // The same activations through quantized_matmul (its own quantization and thread split).
        std::vector<float> vnni(static_cast<size_t>(33 * N)), amx(vnni.size());
        quantized_matmul(x.data(), 33, w, vnni.data(), KernelPath::Avx512Vnni, rounding);
        quantized_matmul(x.data(), 33, w, amx.data(), KernelPath::Amx, rounding);
        EXPECT_EQ(std::memcmp(vnni.data(), amx.data(), vnni.size() * 4), 0) << quant_type_name(type);
      }
    }
  }
}

TEST(QuantizedMatmul, ActivationRoundingNamesAndDefault) {
  EXPECT_EQ(activation_rounding_from_name("int8", "x"), ActivationRounding::Int8);
  EXPECT_EQ(activation_rounding_from_name("int8x2", "x"), ActivationRounding::Int8x2);
  try {
    activation_rounding_from_name("int4", "--activations");
    FAIL() << "int4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--activations = 'int4'"), std::string::npos) << e.what();
  }
  const ActivationRounding saved = default_activation_rounding();
  set_default_activation_rounding(ActivationRounding::Int8);
  EXPECT_EQ(activation_levels(), 1);
  EXPECT_STREQ(activation_rounding_name(ActivationRounding::Default), "int8");
  set_default_activation_rounding(ActivationRounding::Int8x2);
  EXPECT_EQ(activation_levels(), 2);
  set_default_activation_rounding(saved);
}

TEST(QuantizedMatmul, RefusalsNameTheProblem) {
  std::vector<uint8_t> bytes(4 * 22, 0);
  const QuantizedMatrix q5(QuantType::Q5_0, 4, 32, bytes.data());
  std::vector<float> x(32), y(4);
  try {
    quantized_matmul(x.data(), 1, q5, y.data());
    FAIL() << "Q5_0 matmul accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no kernels for Q5_0"), std::string::npos) << e.what();
  }
  try {
    QuantizedMatrix bad(QuantType::Q4_1, 2, 48, bytes.data());
    FAIL() << "48 columns of Q4_1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("48 elements"), std::string::npos) << e.what();
  }
  std::vector<ActBlock> blocks(2);
  EXPECT_THROW(quantize_activations(x.data(), 1, 40, blocks.data()), Error);
  for (KernelPath path : kPaths) {
    if (kernel_path_supported(path)) continue;
    try {
      const QuantizedMatrix w(QuantType::Q8_0, 1, 32, std::vector<uint8_t>(34, 0).data());
      quantized_matmul(x.data(), 1, w, y.data(), path);
      FAIL() << kernel_path_name(path) << " ran on a CPU that does not support it";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(kernel_path_name(path)), std::string::npos) << e.what();
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// loom reads CPUID itself (compiler-neutral); it must agree with GCC's own view of the CPU.
TEST(QuantizedMatmul, CpuDetectionAgreesWithTheCompiler) {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  EXPECT_EQ(kernel_path_supported(KernelPath::Avx2), avx2);
  const bool vnni = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  EXPECT_EQ(kernel_path_supported(KernelPath::Avx512Vnni), vnni);
  // AMX also needs the OS's consent, which GCC does not check; it can only narrow what CPUID says.
  if (!__builtin_cpu_supports("amx-int8")) {
    EXPECT_FALSE(kernel_path_supported(KernelPath::Amx));
  }
  std::printf("[   INFO   ] best kernel path here: %s\n", kernel_path_name(best_kernel_path()));
}
#endif
