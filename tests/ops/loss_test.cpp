// ops::cross_entropy: PyTorch fixtures (ignored rows, large logits), gradcheck (upstream != 1), the fast
// kernel against the double-precision reference, all-ignored behaviour, bad targets.
#include "ops/loss.h"
#include "ops/norm.h"

#include <string>

#include "backends/cpu/loss.h"
#include "core/autograd.h"
#include "support/op_test.h"

using namespace loom;

namespace {
const test::Fixture& fixture() {
  static const test::Fixture f = test::Fixture::load(LOOM_TEST_DIR "/fixtures/cross_entropy.json");
  return f;
}
}  // namespace

TEST(CrossEntropy, MatchesPyTorchWithIgnoredRowsAndLargeLogits) {
  const auto& f = fixture();
  Tensor logits = test::param(f.get("a_logits"));  // [2,5,33], one row offset by +1000
  Tensor loss = ops::cross_entropy(logits, f.get("a_targets"));
  EXPECT_EQ(loss.shape(), Shape{});
  test::expect_close(loss, f.get("a_loss"), 1e-5f, 1e-5f, "loss");
  loss.backward();
  test::expect_close(logits.grad(), f.get("a_dlogits"), 1e-6f, 1e-5f, "dlogits");
}

TEST(CrossEntropy, SingleRowCustomIgnoreIndex) {
  const auto& f = fixture();
  Tensor logits = test::param(f.get("b_logits"));  // [1,7]
  Tensor loss = ops::cross_entropy(logits, f.get("b_targets"), /*ignore_index=*/0);
  test::expect_close(loss, f.get("b_loss"), 1e-6f, 1e-5f, "loss");
  loss.backward();
  test::expect_close(logits.grad(), f.get("b_dlogits"), 1e-6f, 1e-5f, "dlogits");
}

TEST(CrossEntropy, GradcheckWithIgnoredRowAndUpstreamScale) {
  Tensor logits = test::param(test::randn({3, 13}, 1, 2.0f));
  Tensor targets = Tensor::from_vector<int32_t>({3}, {12, -100, 0});
  // gradcheck weighs the scalar output by a random factor: the backward's rescaling path.
  test::gradcheck([targets](const TensorList& in) { return ops::cross_entropy(in[0], targets); }, {logits},
                  1e-2f, 1e-3f, 2e-2f);
}

TEST(CrossEntropy, FastKernelMatchesDoubleReference) {
  const int64_t N = 64, V = 1003;  // V not a multiple of the vector width
  Tensor logits = test::randn({N, V}, 3, 5.0f);
  std::vector<int32_t> t(N);
  for (int64_t n = 0; n < N; ++n) t[n] = n % 7 == 3 ? -100 : static_cast<int32_t>((n * 131) % V);
  std::vector<float> g(N * V), g_ref(N * V);
  const float scale = 1.0f / 55;
  double loss = cpu::cross_entropy_forward(logits.data<float>(), t.data(), N, V, -100, g.data(), scale);
  double ref = cpu::cross_entropy_reference(logits.data<float>(), t.data(), N, V, -100, g_ref.data(), scale);
  EXPECT_NEAR(loss, ref, 1e-5 * std::fabs(ref));
  double no_grad = cpu::cross_entropy_forward(logits.data<float>(), t.data(), N, V, -100, nullptr, scale);
  EXPECT_EQ(loss, no_grad);
  for (int64_t i = 0; i < N * V; ++i) {
    ASSERT_NEAR(g[i], g_ref[i], 1e-8f + 1e-5f * std::fabs(g_ref[i])) << "element " << i;
  }
}

TEST(CrossEntropy, AllIgnoredGivesZeroLossAndZeroGrad) {
  Tensor logits = test::param(test::randn({2, 3, 5}, 4));
  Tensor targets = Tensor::full({2, 3}, -100.0f, DType::I32);
  Tensor loss = ops::cross_entropy(logits, targets);
  EXPECT_EQ(loss.item(), 0.0f);
  loss.backward();
  for (float v : logits.grad().to_vector<float>()) EXPECT_EQ(v, 0.0f);
}

TEST(CrossEntropy, NoGradPathGivesTheSameLoss) {
  Tensor logits = test::param(test::randn({4, 37}, 5));
  Tensor targets = Tensor::from_vector<int32_t>({4}, {0, 36, 5, 5});
  const float with_grad = ops::cross_entropy(logits, targets).item();
  autograd::NoGradGuard ng;
  EXPECT_EQ(ops::cross_entropy(logits, targets).item(), with_grad);
}

TEST(CrossEntropy, BadTargetsAndShapesNameTheValues) {
  Tensor logits = Tensor::zeros({2, 5});
  try {
    ops::cross_entropy(logits, Tensor::from_vector<int32_t>({2}, {1, 5}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("target 5"), std::string::npos) << msg;
    EXPECT_NE(msg.find("V=5"), std::string::npos) << msg;
  }
  try {
    ops::cross_entropy(logits, Tensor::from_vector<int32_t>({3}, {1, 2, 3}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[3]"), std::string::npos) << e.what();
  }
}

// ---- linear_cross_entropy (the LM head and its loss, fused and chunked) --------------------------

namespace {

struct LossAndGrads {
  Tensor loss, dx, dw;
};

// Loss and gradients for upstream gradient `upstream`, fused or as linear() then cross_entropy().
LossAndGrads lm_head_loss(const Tensor& x0, const Tensor& w0, const Tensor& targets, bool fused, int64_t chunk,
                          ops::MatmulPrecision precision, float upstream) {
  Tensor x = test::param(x0), w = test::param(w0);
  Tensor loss = fused ? ops::linear_cross_entropy(x, w, targets, -100, precision, chunk)
                      : ops::cross_entropy(ops::linear(x, w, Tensor(), ops::WeightLayout::OutIn, precision), targets);
  autograd::backward(loss, Tensor::full({}, upstream));
  return {loss.detach(), x.grad(), w.grad()};
}

Tensor targets_with_ignored(int64_t n, int32_t v, uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::I32);
  for (int64_t i = 0; i < n; ++i) t.data<int32_t>()[i] = i % 7 == 3 ? -100 : static_cast<int32_t>((i * 31 + seed) % v);
  return t;
}

}  // namespace

TEST(LinearCrossEntropy, EqualsLinearThenCrossEntropyForEveryChunking) {
  // N = 74 rows over chunks of 1, 16 (a ragged last chunk), exactly N, and more than N; ignored rows;
  // an upstream gradient != 1 (the backward's rescale).
  Tensor x = test::randn({2, 37, 24}, 1), w = test::randn({53, 24}, 2, 0.3f);
  Tensor targets = targets_with_ignored(74, 53, 5).view({2, 37});
  for (float upstream : {1.0f, 0.37f}) {
    LossAndGrads want = lm_head_loss(x, w, targets, false, 0, ops::MatmulPrecision::F32, upstream);
    for (int64_t chunk : {1, 16, 74, 1000}) {
      SCOPED_TRACE("chunk_rows=" + std::to_string(chunk) + " upstream=" + std::to_string(upstream));
      LossAndGrads got = lm_head_loss(x, w, targets, true, chunk, ops::MatmulPrecision::F32, upstream);
      test::expect_close(got.loss, want.loss, 1e-6f, 1e-6f, "loss");
      test::expect_close(got.dx, want.dx, 1e-6f, 1e-5f, "dx");
      test::expect_close(got.dw, want.dw, 1e-6f, 1e-5f, "dw");
    }
  }
}

TEST(LinearCrossEntropy, IgnoredRowsSkipTheVocabularyAndGiveTheKeptRowsAloneTheirBits) {
  // SFT's shape: each row a run of ignored prompt positions, then the trained ones. Only the kept rows meet
  // the vocabulary (gathered), so loss, dx and dw are bit for bit those of the kept rows alone, and the
  // ignored rows' dx is exactly zero. Also every row ignored: zero loss and zero gradients.
  const int64_t N = 40, C = 24, V = 53;
  Tensor x = test::randn({N, C}, 11), w = test::randn({V, C}, 12, 0.3f);
  Tensor targets = Tensor::full({N}, -100.0f).to(DType::I32);
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < N; ++i) {
    if (i % 10 >= 7) {  // the last 3 of every 10
      targets.data<int32_t>()[i] = static_cast<int32_t>((i * 17) % V);
      kept.push_back(i);
    }
  }
  const int64_t K = static_cast<int64_t>(kept.size());
  Tensor xk = Tensor::empty({K, C}), tk = Tensor::empty({K}, DType::I32);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t c = 0; c < C; ++c) xk.data<float>()[k * C + c] = x.data<float>()[kept[k] * C + c];
    tk.data<int32_t>()[k] = targets.data<int32_t>()[kept[k]];
  }
  for (int64_t chunk : {5, 512}) {
    SCOPED_TRACE("chunk_rows=" + std::to_string(chunk));
    LossAndGrads got = lm_head_loss(x, w, targets, true, chunk, ops::MatmulPrecision::F32, 0.37f);
    LossAndGrads alone = lm_head_loss(xk, w, tk, true, chunk, ops::MatmulPrecision::F32, 0.37f);
    EXPECT_EQ(got.loss.item(), alone.loss.item());
    test::expect_bitwise(got.dw, alone.dw, "dw");
    for (int64_t i = 0, k = 0; i < N; ++i) {
      const bool is_kept = k < K && kept[k] == i;
      for (int64_t c = 0; c < C; ++c) {
        const float g = got.dx.data<float>()[i * C + c];
        if (is_kept) {
          ASSERT_EQ(g, alone.dx.data<float>()[k * C + c]) << "row " << i << " col " << c;
        } else {
          ASSERT_EQ(g, 0.0f) << "ignored row " << i << " col " << c;
        }
      }
      if (is_kept) ++k;
    }
  }
  Tensor none = Tensor::full({N}, -100.0f).to(DType::I32);
  LossAndGrads empty = lm_head_loss(x, w, none, true, 8, ops::MatmulPrecision::F32, 1.0f);
  EXPECT_EQ(empty.loss.item(), 0.0f);
  test::expect_bitwise(empty.dx, Tensor::zeros({N, C}), "dx");
  test::expect_bitwise(empty.dw, Tensor::zeros({V, C}), "dw");
}

TEST(LinearCrossEntropy, Bf16PrecisionEqualsTheUnfusedBf16Pair) {
  // Same bf16-rounded GEMM operands, f32 accumulation: only the order of dw's sum over chunks differs.
  Tensor x = test::randn({70, 40}, 3), w = test::randn({97, 40}, 4, 0.2f);
  Tensor targets = targets_with_ignored(70, 97, 9);
  LossAndGrads want = lm_head_loss(x, w, targets, false, 0, ops::MatmulPrecision::BF16, 1.0f);
  LossAndGrads got = lm_head_loss(x, w, targets, true, 32, ops::MatmulPrecision::BF16, 1.0f);
  test::expect_close(got.loss, want.loss, 1e-6f, 1e-6f, "loss");
  test::expect_close(got.dx, want.dx, 1e-6f, 1e-5f, "dx");
  test::expect_close(got.dw, want.dw, 1e-6f, 1e-5f, "dw");
  // And bf16 is an approximation of f32, not something else.
  LossAndGrads f32 = lm_head_loss(x, w, targets, true, 32, ops::MatmulPrecision::F32, 1.0f);
  test::expect_close(got.loss, f32.loss, 1e-2f, 1e-2f, "bf16 vs f32 loss");
}

TEST(LinearCrossEntropy, Bf16WithPreRoundedXAndWeightCopyGivesTheSameBits) {
  // The mixed-precision llama hands the head a bf16 x (ln_final rounds its output) and the head weight's
  // bf16 copy: the same bits as rounding both inside, and the same f32 gradient back into the norm.
  const auto bf = ops::MatmulPrecision::BF16;
  Tensor x0 = test::randn({70, 40}, 3), w0 = test::randn({97, 40}, 4, 0.2f), g0 = test::randn({40}, 5);
  Tensor targets = targets_with_ignored(70, 97, 9);
  auto run = [&](bool pre_rounded) {
    Tensor x = test::param(x0), w = test::param(w0), g = test::param(g0);
    Tensor h = pre_rounded ? ops::rms_norm(x, g, 1e-5f, DType::BF16) : ops::rms_norm(x, g);
    Tensor loss = ops::linear_cross_entropy(h, w, targets, -100, bf, 32, pre_rounded ? w0.to(DType::BF16) : Tensor());
    autograd::backward(loss, Tensor::full({}, 0.5f));
    return TensorList{loss, x.grad(), w.grad(), g.grad()};
  };
  const TensorList a = run(false), b = run(true);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i].to_vector<float>(), a[i].to_vector<float>()) << i;
  test::expect_error_mentions([&] { ops::linear_cross_entropy(x0, w0, targets, -100, ops::MatmulPrecision::F32, 32,
                                                              w0.to(DType::BF16)); },
                              {"linear_cross_entropy", "w_bf16"});
  test::expect_error_mentions([&] { ops::linear_cross_entropy(x0.to(DType::BF16), w0, targets); },
                              {"linear_cross_entropy", "x"});
}

TEST(LinearCrossEntropy, NoGradPathAllIgnoredAndErrors) {
  Tensor x = test::randn({9, 8}, 5), w = test::randn({11, 8}, 6);
  Tensor targets = targets_with_ignored(9, 11, 1);
  const float with_grad = lm_head_loss(x, w, targets, true, 4, ops::MatmulPrecision::F32, 1.0f).loss.item();
  {
    autograd::NoGradGuard no_grad;
    EXPECT_EQ(ops::linear_cross_entropy(x, w, targets, -100, ops::MatmulPrecision::F32, 4).item(), with_grad);
  }
  Tensor ignored = Tensor::full({9}, -100.0f).to(DType::I32);
  LossAndGrads none = lm_head_loss(x, w, ignored, true, 4, ops::MatmulPrecision::F32, 1.0f);
  EXPECT_EQ(none.loss.item(), 0.0f);
  for (float v : none.dw.to_vector<float>()) ASSERT_EQ(v, 0.0f);
  test::expect_error_mentions([&] { ops::linear_cross_entropy(x, w, Tensor::full({9}, 11.0f).to(DType::I32)); },
                              {"target 11", "V=11"});
  test::expect_error_mentions([&] { ops::linear_cross_entropy(x, test::randn({11, 7}, 7), targets); },
                              {"[11, 7]", "C=8"});
  test::expect_error_mentions([&] { ops::linear_cross_entropy(x, w, targets_with_ignored(8, 11, 1)); },
                              {"[8]", "[9]"});
}

TEST(LinearCrossEntropy, NeverHoldsTheFullLogits) {
  // N = 2048 rows, V = 4096: the unfused pair holds logits and their gradient, 2 x 32 MiB. The fused op
  // with 256-row chunks needs two 4 MiB chunk buffers, plus dx and dw.
  const int64_t n = 2048, v = 4096, c = 64;
  Tensor x = test::randn({n, c}, 8), w = test::randn({v, c}, 9, 0.1f);
  Tensor targets = targets_with_ignored(n, static_cast<int32_t>(v), 2);
  Allocator& alloc = allocator_for(Device::cpu());
  const int64_t in_use = alloc.stats().bytes_in_use;
  alloc.reset_peak();
  lm_head_loss(x, w, targets, true, 256, ops::MatmulPrecision::F32, 1.0f);
  const int64_t fused_peak = alloc.stats().peak_bytes_in_use - in_use;
  alloc.reset_peak();
  lm_head_loss(x, w, targets, false, 0, ops::MatmulPrecision::F32, 1.0f);
  const int64_t unfused_peak = alloc.stats().peak_bytes_in_use - in_use;
  const int64_t logits_bytes = n * v * 4;
  EXPECT_GE(unfused_peak, 2 * logits_bytes);
  EXPECT_LT(fused_peak, logits_bytes / 2) << "fused peak " << fused_peak << " bytes";
}
