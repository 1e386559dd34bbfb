// LoRA on a linear layer (nn/lora.h): forward and backward against PyTorch (tests/nn/fixtures/
// make_lora_fixtures.py), finite differences, PEFT's initialisation, the frozen base, dropout. And on
// routed experts (an expert stack's adapters through ops::moe_experts, as DeepSeek-V3's MoE runs them).
#include <gtest/gtest.h>

#include <cmath>

#include "core/autograd.h"
#include "core/parallel.h"
#include "nn/layers.h"
#include "nn/lora.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/moe.h"
#include "quant/qmatmul.h"
#include "quant/quant.h"
#include "support/op_test.h"

namespace loom::test {
namespace {

Fixture fixture() { return Fixture::load(std::string(LOOM_TEST_DIR) + "/fixtures/lora.json"); }

// A frozen Linear holding the fixture's weight (and bias), with an adapter holding its A and B.
struct Adapted {
  std::unique_ptr<nn::Linear> linear;
  nn::LoRA* lora = nullptr;
};

Adapted adapted(const Fixture& f, const std::string& tag, float dropout = 0.0f) {
  const Tensor w = f.get(tag + "_w");
  const bool bias = f.has(tag + "_bias");
  Adapted a;
  a.linear = std::make_unique<nn::Linear>("layers.0.attn.q_proj", w.size(1), w.size(0), RngKey{}, nn::Init::zeros(), bias);
  a.linear->weight.value.copy_from(w);
  a.linear->weight.value.set_requires_grad(false);
  if (bias) {
    a.linear->bias->value.copy_from(f.get(tag + "_bias"));
    a.linear->bias->value.set_requires_grad(false);
  }
  nn::LoraOptions o;
  o.rank = static_cast<int64_t>(f.get(tag + "_rank").item());
  o.alpha = f.get(tag + "_alpha").item();
  o.dropout = dropout;
  a.lora = &a.linear->attach_lora(o, RngKey::from_seed(7));
  a.lora->A.value.copy_from(f.get(tag + "_a"));
  a.lora->B.value.copy_from(f.get(tag + "_b_lora"));
  return a;
}

TEST(Lora, ForwardAndBackwardMatchPyTorch) {
  const Fixture f = fixture();
  for (const std::string tag : {"a", "b", "c"}) {
    SCOPED_TRACE(tag);
    Adapted a = adapted(f, tag);
    Tensor x = param(f.get(tag + "_x"));
    Tensor y = a.linear->forward(x);
    expect_close(y, f.get(tag + "_y"), 2e-5f, 1e-4f, tag + " y");
    autograd::backward(y, f.get(tag + "_dy"));
    expect_close(x.grad(), f.get(tag + "_dx"), 2e-5f, 1e-4f, tag + " dx");
    expect_close(a.lora->A.value.grad(), f.get(tag + "_da"), 2e-5f, 1e-4f, tag + " dA");
    expect_close(a.lora->B.value.grad(), f.get(tag + "_db_lora"), 2e-5f, 1e-4f, tag + " dB");
    // The base is frozen: no gradient is computed for it.
    EXPECT_FALSE(a.linear->weight.value.grad().defined());
    if (a.linear->bias) {
      EXPECT_FALSE(a.linear->bias->value.grad().defined());
    }
  }
}

TEST(Lora, TheDownProjAdapterRebuildsSwiGLUsProductForTheSameBitsAndKeepsNone) {
  // delta(h, precision, recompute): the same y and gradients (gate, up, A, B) bit for bit as delta(h), the
  // product rebuilt once in the backward, and h itself no longer held by the graph (plain delta keeps it).
  const int64_t d_ff = 24, d = 10;
  nn::LoraOptions o;
  o.rank = 4;
  o.alpha = 8;
  const Tensor g0 = randn({3, 5, d_ff}, 41), u0 = randn({3, 5, d_ff}, 42), dy = randn({3, 5, d}, 43);
  const Tensor b0 = randn({d, 4}, 44, 0.5f);
  struct Run {
    Tensor y, dg, du, dA, dB;
    bool h_alive_after_forward;
  };
  int calls = 0;
  auto run = [&](bool rebuild) {
    nn::LoRA lora("layers.0.ffn.w2", d_ff, d, o, RngKey::from_seed(3));
    lora.B.value.copy_from(b0);
    Tensor g = param(g0), u = param(u0);
    Tensor h = ops::swiglu(g, u);
    std::weak_ptr<TensorImpl> h_impl = h.impl_ptr();
    Tensor y = rebuild ? lora.delta(h, ops::MatmulPrecision::F32, [g, u, &calls] {
      ++calls;
      return ops::swiglu(g, u);
    })
                       : lora.delta(h);
    h = Tensor();
    Run r{y.detach(), {}, {}, {}, {}, !h_impl.expired()};
    EXPECT_EQ(calls, 0);
    autograd::backward(y, dy);
    r.dg = g.grad();
    r.du = u.grad();
    r.dA = lora.A.value.grad();
    r.dB = lora.B.value.grad();
    return r;
  };
  const Run plain = run(false), rebuilt = run(true);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(plain.h_alive_after_forward);
  EXPECT_FALSE(rebuilt.h_alive_after_forward);
  expect_bitwise(rebuilt.y, plain.y, "y");
  expect_bitwise(rebuilt.dg, plain.dg, "d gate");
  expect_bitwise(rebuilt.du, plain.du, "d up");
  expect_bitwise(rebuilt.dA, plain.dA, "dA");
  expect_bitwise(rebuilt.dB, plain.dB, "dB");
  // A rebuilt input of another shape is an error naming it, not a wrong gradient.
  Tensor x = param(randn({6, d_ff}, 45));
  nn::LoRA lora("layers.0.ffn.w2", d_ff, d, o, RngKey::from_seed(3));
  Tensor y = lora.delta(x, ops::MatmulPrecision::F32, [] { return Tensor::zeros({5, 24}); });
  expect_error_mentions([&] { autograd::backward(y, randn({6, d}, 46)); }, {"recomputed input", "[5, 24]"});
}

TEST(Lora, GradientsMatchFiniteDifferences) {
  const Fixture f = fixture();
  Adapted a = adapted(f, "a");
  TensorList inputs = {param(f.get("a_x")), param(f.get("a_a")), param(f.get("a_b_lora"))};
  gradcheck(
      [&](const TensorList& in) {
        a.lora->A.value = in[1];
        a.lora->B.value = in[2];
        return a.linear->forward(in[0]);
      },
      inputs);
}

TEST(Lora, StartsAsPeftDoesAndComputesTheBaseLayer) {
  const int64_t in = 48, out = 20;
  nn::Linear l("layers.3.ffn.w1", in, out, RngKey::from_seed(1));
  l.weight.value.set_requires_grad(false);
  nn::LoraOptions o;
  o.rank = 6;
  o.alpha = 12;
  nn::LoRA& lora = l.attach_lora(o, RngKey::from_seed(2));
  EXPECT_EQ(lora.A.name, "layers.3.ffn.w1.lora_A.weight");
  EXPECT_EQ(lora.B.name, "layers.3.ffn.w1.lora_B.weight");
  EXPECT_EQ(lora.A.value.shape(), Shape({6, in}));
  EXPECT_EQ(lora.B.value.shape(), Shape({out, 6}));
  EXPECT_FLOAT_EQ(lora.scale, 2.0f);
  // kaiming_uniform_(a=sqrt(5)): uniform in +-1/sqrt(in); spread over the range, not clustered.
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  float lo = 1, hi = -1;
  for (int64_t i = 0; i < lora.A.value.numel(); ++i) {
    const float v = lora.A.value.data<float>()[i];
    EXPECT_LE(std::fabs(v), bound);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_LT(lo, -0.9f * bound);
  EXPECT_GT(hi, 0.9f * bound);
  for (int64_t i = 0; i < lora.B.value.numel(); ++i) EXPECT_EQ(lora.B.value.data<float>()[i], 0.0f);
  // B = 0: the adapted layer computes the base layer's bits.
  const Tensor x = randn({2, 5, in}, 3);
  expect_bitwise(l.forward(x), l.base_forward(x), "adapted at init vs base");
  // The adapter's parameters follow the layer's weight; detaching removes them.
  auto params = l.parameters();
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[1]->name, "layers.3.ffn.w1.lora_A.weight");
  EXPECT_THROW(l.attach_lora(o, RngKey{}), Error);
  auto detached = l.detach_lora();
  EXPECT_NE(detached, nullptr);
  EXPECT_EQ(l.parameters().size(), 1u);
}

TEST(Lora, BadOptionsAreRefusedNamingTheLayer) {
  nn::Linear l("layers.0.attn.v_proj", 8, 4, RngKey{});
  nn::LoraOptions o;
  o.rank = 5;  // > min(in, out)
  expect_error_mentions([&] { l.attach_lora(o, RngKey{}); },
                        {"layers.0.attn.v_proj: LoRA rank must be in [1, min(in, out) = 4], got 5"});
  o.rank = 2;
  o.dropout = 1.0f;
  expect_error_mentions([&] { l.attach_lora(o, RngKey{}); }, {"LoRA dropout must be in [0, 1), got 1"});
}

TEST(Lora, MergedDeltaIsScaleTimesBA) {
  const Fixture f = fixture();
  Adapted a = adapted(f, "b");
  const Tensor x = f.get("b_x");
  // x (W + scale B A)^T equals the adapted layer's output.
  Tensor merged = ops::add(a.linear->weight.value, a.lora->merged_delta());
  autograd::NoGradGuard no_grad;
  Tensor want = a.linear->forward(x);
  Tensor got = ops::linear(x, merged);
  expect_close(got, want, 1e-5f, 1e-5f, "merged");
}

TEST(Lora, DropoutOnlyInsideAScopeAndIndependentOfThreads) {
  const Fixture f = fixture();
  Adapted a = adapted(f, "b", /*dropout=*/0.5f);
  const Tensor x = f.get("b_x");
  autograd::NoGradGuard no_grad;
  const Tensor plain = a.linear->forward(x);
  Tensor first;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    nn::LoraDropoutScope scope(RngKey::from_seed(9));
    Tensor y = a.linear->forward(x);
    if (!first.defined()) {
      first = y;
      EXPECT_FALSE(bitwise_equal(y, plain)) << "dropout changed nothing";
    } else {
      expect_bitwise(y, first, "dropout on " + std::to_string(threads) + " threads");
    }
  }
  set_num_threads(saved);
  {
    nn::LoraDropoutScope none(std::nullopt);
    expect_bitwise(a.linear->forward(x), plain, "no key: no dropout");
  }
  // Dropout on the adapter's input only, keyed by the scope's key and the layer's name.
  const Tensor dropped = ops::dropout(x, 0.5f, RngKey::from_seed(9).fold_in("layers.0.attn.q_proj"));
  const Tensor want = ops::add(a.linear->base_forward(x), a.lora->delta(dropped));  // outside a scope: no dropout
  nn::LoraDropoutScope scope(RngKey::from_seed(9));
  expect_bitwise(a.linear->forward(x), want, "dropout on the adapter's input");
}

TEST(Lora, Bf16PrecisionIsCloseToF32) {
  const Fixture f = fixture();
  Adapted a = adapted(f, "b");
  const Tensor x = f.get("b_x");
  autograd::NoGradGuard no_grad;
  Tensor y32 = a.linear->forward(x);
  a.linear->precision = ops::MatmulPrecision::BF16;
  Tensor y16 = a.linear->forward(x);
  EXPECT_LT(max_error_relative_to_max(y16, y32), 2e-2f);
}

}  // namespace
}  // namespace loom::test

namespace loom::test {
namespace {

// A Linear whose weight is held quantized (Q8_0 or Q4_1) and its f32 twin holding the dequantized values.
struct QuantizedPair {
  std::unique_ptr<nn::Linear> q, f;
};
QuantizedPair quantized_pair(quant::QuantType type, int64_t in, int64_t out) {
  QuantizedPair p;
  p.q = std::make_unique<nn::Linear>("layers.0.ffn.w2", in, out, RngKey{}, nn::Init::zeros(), true);
  p.f = std::make_unique<nn::Linear>("layers.0.ffn.w2", in, out, RngKey{}, nn::Init::zeros(), true);
  const Tensor w = randn({out, in}, 21, 0.2f);
  auto qm = std::make_shared<quant::QuantizedMatrix>(quant::QuantizedMatrix::quantize(type, w.data<float>(), out, in));
  Tensor deq = Tensor::empty({out, in});
  qm->dequantize(deq.data<float>());
  p.f->weight.value.copy_from(deq);
  p.q->set_quantized(qm);
  const Tensor b = randn({out}, 22);
  for (auto* l : {p.q.get(), p.f.get()}) {
    l->bias->value.copy_from(b);
    l->weight.value.set_requires_grad(false);
    l->bias->value.set_requires_grad(false);
  }
  return p;
}

TEST(Qlora, AQuantizedBaseTrainsItsAdapterAsItsDequantizedTwinDoes) {
  // out = 300: more than one tile of 256 rows.
  for (auto type : {quant::QuantType::Q8_0, quant::QuantType::Q4_1}) {
    SCOPED_TRACE(quant::quant_type_name(type));
    QuantizedPair p = quantized_pair(type, 64, 300);
    nn::LoraOptions o;
    o.rank = 4;
    for (auto* l : {p.q.get(), p.f.get()}) {
      l->attach_lora(o, RngKey::from_seed(3));
      l->lora->B.value.copy_from(randn({300, 4}, 23, 0.1f));  // nonzero, so A gets a gradient
    }
    const Tensor x0 = randn({2, 5, 64}, 24), dy = randn({2, 5, 300}, 25);
    Tensor xq = param(x0), xf = param(x0);
    Tensor yq = p.q->forward(xq), yf = p.f->forward(xf);
    expect_close(yq, yf, 1e-5f, 1e-5f, "y");
    autograd::backward(yq, dy);
    autograd::backward(yf, dy);
    expect_close(xq.grad(), xf.grad(), 1e-5f, 1e-5f, "dx");
    expect_close(p.q->lora->A.value.grad(), p.f->lora->A.value.grad(), 1e-5f, 1e-5f, "dA");
    expect_close(p.q->lora->B.value.grad(), p.f->lora->B.value.grad(), 1e-5f, 1e-5f, "dB");
  }
}

TEST(Qlora, TheQuantizedHeadAndItsLossFusedEqualTheLogitsThenTheLoss) {
  // V = 600: two whole tiles of 256 vocabulary rows and a partial one; two rows ignored.
  QuantizedPair p = quantized_pair(quant::QuantType::Q4_1, 64, 600);
  const Tensor x0 = randn({2, 7, 64}, 31);
  std::vector<int32_t> t;
  for (int i = 0; i < 14; ++i) t.push_back(i == 3 || i == 11 ? -100 : (i * 97 + 5) % 600);
  const Tensor targets = Tensor::from_vector<int32_t>({2, 7}, t);
  Tensor xa = param(x0), xb = param(x0);
  Tensor fused = ops::dequantized_linear_cross_entropy(xa, p.q->quantized, targets);
  Tensor unfused = ops::cross_entropy(ops::dequantized_linear(xb, p.q->quantized), targets);
  EXPECT_NEAR(fused.item(), unfused.item(), 2e-6);
  ops::scale(fused, 3.0f).backward();
  ops::scale(unfused, 3.0f).backward();
  expect_close(xa.grad(), xb.grad(), 1e-6f, 1e-5f, "dx");
  // Only the kept rows meet the vocabulary (gathered): the ignored rows' gradient is exactly zero, and the
  // kept rows alone give the same loss bits. Every row ignored: zero loss, zero gradient.
  for (int64_t r : {3, 11}) {
    for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(xa.grad().data<float>()[r * 64 + c], 0.0f) << "row " << r;
  }
  {
    std::vector<float> xk;
    std::vector<int32_t> tk;
    for (int i = 0; i < 14; ++i) {
      if (t[static_cast<size_t>(i)] == -100) continue;
      xk.insert(xk.end(), x0.data<float>() + i * 64, x0.data<float>() + (i + 1) * 64);
      tk.push_back(t[static_cast<size_t>(i)]);
    }
    Tensor alone = ops::dequantized_linear_cross_entropy(Tensor::from_vector<float>({12, 64}, xk), p.q->quantized,
                                                         Tensor::from_vector<int32_t>({12}, tk));
    EXPECT_EQ(ops::dequantized_linear_cross_entropy(x0, p.q->quantized, targets).item(), alone.item());
    Tensor xn = param(x0);
    Tensor none = ops::dequantized_linear_cross_entropy(xn, p.q->quantized,
                                                        Tensor::from_vector<int32_t>({2, 7}, std::vector<int32_t>(14, -100)));
    EXPECT_EQ(none.item(), 0.0f);
    none.backward();
    expect_bitwise(xn.grad(), Tensor::zeros({2, 7, 64}), "dx with every row ignored");
  }
  TensorList inputs = {param(randn({3, 64}, 32))};
  const Tensor t3 = Tensor::from_vector<int32_t>({3}, {5, 300, 599});
  gradcheck([&](const TensorList& in) { return ops::dequantized_linear_cross_entropy(in[0], p.q->quantized, t3); }, inputs);
  autograd::NoGradGuard no_grad;
  EXPECT_NEAR(ops::dequantized_linear_cross_entropy(x0, p.q->quantized, targets).item(), unfused.item(), 2e-6);
  expect_error_mentions([&] { ops::dequantized_linear_cross_entropy(x0, p.q->quantized, Tensor::from_vector<int32_t>({2, 7}, std::vector<int32_t>(14, 600))); },
                        {"600"});
}

TEST(Qlora, AnEmbeddingHeldQuantizedLooksUpItsDequantizedRows) {
  const Tensor w = randn({40, 64}, 41, 0.2f);
  auto qm = std::make_shared<quant::QuantizedMatrix>(quant::QuantizedMatrix::quantize(quant::QuantType::Q4_1, w.data<float>(), 40, 64));
  Tensor deq = Tensor::empty({40, 64});
  qm->dequantize(deq.data<float>());
  nn::Embedding e("token_embeddings", 40, 64, RngKey{});
  e.quantized = qm;
  e.weight.value = Tensor::empty({0});  // as the QuantizedOnly import leaves it: never read
  const Tensor ids = Tensor::from_vector<int32_t>({2, 3}, {0, 39, 7, 7, 12, 1});
  expect_bitwise(e.forward(ids), ops::embedding(ids, deq), "rows dequantized from the blocks");
  expect_error_mentions([&] { e.forward(Tensor::from_vector<int32_t>({1}, {40})); }, {"id 40", "V=40"});
}

TEST(Qlora, DequantizedLinearMatchesFiniteDifferencesAndTheIntegerPathWithoutGrad) {
  QuantizedPair p = quantized_pair(quant::QuantType::Q8_0, 32, 270);
  TensorList inputs = {param(randn({3, 32}, 26)), param(randn({270}, 27))};
  gradcheck([&](const TensorList& in) { return ops::dequantized_linear(in[0], p.q->quantized, in[1]); }, inputs);
  // Nothing recording: the integer kernels, unless the layer asks for the dequantized tiles.
  autograd::NoGradGuard no_grad;
  const Tensor x = randn({3, 32}, 28);
  const Tensor exact = ops::dequantized_linear(x, p.q->quantized, p.q->bias->value);
  const Tensor integer = p.q->forward(x);
  EXPECT_FALSE(bitwise_equal(integer, exact)) << "the integer kernels round x to 8 bits";
  p.q->dequantized_matmul = true;
  expect_bitwise(p.q->forward(x), exact, "dequantized_matmul");
}

TEST(Qlora, TheQuantizedWeightItselfIsNeverTrained) {
  QuantizedPair p = quantized_pair(quant::QuantType::Q8_0, 32, 8);
  p.q->weight.value.set_requires_grad(true);
  Tensor x = param(randn({2, 32}, 29));
  expect_error_mentions([&] { p.q->forward(x); }, {"layers.0.ffn.w2.weight is held quantized", "no backward pass"});
}

}  // namespace

namespace {
// The three expert stacks of the fixture with their adapters (A, B as drawn there), frozen weights.
struct ExpertAdapted {
  std::vector<Tensor> w;                     // w1, w3, w2
  std::vector<std::unique_ptr<nn::LoRA>> l;  // their adapters
  Tensor forward(const Tensor& x, const Tensor& index, const Tensor& gates) const {
    return ops::moe_experts(x, index, gates, l[0]->adapted(w[0]), l[1]->adapted(w[1]), l[2]->adapted(w[2]));
  }
};

ExpertAdapted expert_adapted(const Fixture& f) {
  ExpertAdapted a;
  nn::LoraOptions o;
  o.rank = static_cast<int64_t>(f.get("rank").item());
  o.alpha = f.get("alpha").item();
  for (const std::string tag : {"w1", "w3", "w2"}) {
    Tensor w = f.get(tag);  // [E, out, in]
    a.w.push_back(w);
    a.l.push_back(std::make_unique<nn::LoRA>("layers.1.moe.experts." + tag, w.size(2), w.size(1), o, RngKey::from_seed(3),
                                             w.size(0)));
    a.l.back()->A.value.copy_from(f.get(tag + "_a"));
    a.l.back()->B.value.copy_from(f.get(tag + "_b"));
  }
  return a;
}

Fixture expert_fixture() { return Fixture::load(std::string(LOOM_TEST_DIR) + "/fixtures/expert_lora.json"); }
}  // namespace

TEST(ExpertLora, ForwardAndBackwardMatchPyTorch) {
  const Fixture f = expert_fixture();
  ExpertAdapted a = expert_adapted(f);
  EXPECT_EQ(a.l[0]->A.name, "layers.1.moe.experts.w1.lora_A.weight");
  EXPECT_EQ(a.l[2]->B.value.shape(), (Shape{3, 6, 2}));  // w2 [E, C, F]: B [E, C, r]
  Tensor x = param(f.get("x")), gates = param(f.get("gates"));
  Tensor y = a.forward(x, f.get("expert_index"), gates);
  expect_close(y, f.get("y"), 2e-5f, 1e-4f, "y");
  autograd::backward(y, f.get("dy"));
  expect_close(x.grad(), f.get("dx"), 2e-5f, 1e-4f, "dx");
  expect_close(gates.grad(), f.get("dgates"), 2e-5f, 1e-4f, "dgates");
  for (size_t i = 0; i < 3; ++i) {
    const std::string tag = i == 0 ? "w1" : i == 1 ? "w3" : "w2";
    expect_close(a.l[i]->A.value.grad(), f.get(tag + "_da"), 2e-5f, 1e-4f, tag + " dA");
    expect_close(a.l[i]->B.value.grad(), f.get(tag + "_db"), 2e-5f, 1e-4f, tag + " dB");
  }
}

TEST(ExpertLora, GradientsMatchFiniteDifferences) {
  const Fixture f = expert_fixture();
  ExpertAdapted a = expert_adapted(f);
  TensorList inputs = {param(f.get("x")), param(f.get("gates"))};
  for (auto& l : a.l) {
    inputs.push_back(param(l->A.value.clone()));
    inputs.push_back(param(l->B.value.clone()));
  }
  const Tensor index = f.get("expert_index");
  gradcheck(
      [&](const TensorList& in) {
        for (size_t i = 0; i < 3; ++i) {
          a.l[i]->A.value = in[2 + 2 * i];
          a.l[i]->B.value = in[3 + 2 * i];
        }
        return a.forward(in[0], index, in[1]);
      },
      inputs);
}

TEST(ExpertLora, StartsAtTheBaseMergesAsItAdaptsAndRefusesDropout) {
  nn::LoraOptions o;
  o.rank = 2;
  const Tensor w = randn({4, 5, 6}, 8);
  nn::LoRA l("layers.1.moe.experts.w1", 6, 5, o, RngKey::from_seed(9), 4);
  EXPECT_EQ(l.A.value.shape(), (Shape{4, 2, 6}));
  expect_bitwise(l.adapted(w), w, "B = 0: the base experts");  // PEFT's start: B zero
  l.B.value.copy_from(randn({4, 5, 2}, 10));
  autograd::NoGradGuard no_grad;
  Tensor merged = w.clone();
  ops::add_(merged, l.merged_delta());
  expect_bitwise(merged, l.adapted(w), "w + merged_delta() is adapted(w)");
  expect_error_mentions([&] { l.delta(randn({3, 6}, 11)); }, {"layers.1.moe.experts.w1", "adapted"});
  o.dropout = 0.1f;
  expect_error_mentions([&] { nn::LoRA("layers.1.moe.experts.w2", 6, 5, o, RngKey{}, 4); },
                        {"layers.1.moe.experts.w2", "dropout on routed experts"});
}

}  // namespace loom::test
