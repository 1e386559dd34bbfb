// Quantized weights inside a model: nn::Linear::set_quantized wired through the Llama forward, decode
// and loss, against the same model holding the dequantized weights in f32; backward refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "models/llama/model.h"
#include "quant/qmatmul.h"
#include "support/model_fixture.h"

using namespace loom;
using namespace loom::quant;

namespace {

llama::Config tiny_config() {
  return {.vocab_size = 96, .context_length = 16, .d_model = 64, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2,
      .d_ff = 96};
}

// Quantizes every Linear of `q` (Q4_1, the head Q8_0, as SmolLM2's GGUF has them), gives `f` the
// dequantized values in f32, then poisons q's f32 weights with NaN: if the quantized model read them,
// its logits would be NaN.
void quantize_model(llama::TransformerLM& q, llama::TransformerLM& f) {
  std::vector<nn::Linear*> lq = test::llama_linears(q), lf = test::llama_linears(f);
  for (size_t i = 0; i < lq.size(); ++i) {
    Tensor& w = lq[i]->weight.value;
    const QuantType type = lq[i] == &q.lm_head ? QuantType::Q8_0 : QuantType::Q4_1;
    auto qm = std::make_shared<QuantizedMatrix>(QuantizedMatrix::quantize(type, w.data<float>(), w.size(0), w.size(1)));
    qm->dequantize(lf[i]->weight.value.data<float>());
    lq[i]->set_quantized(qm);
    w.fill_(std::numeric_limits<float>::quiet_NaN());
  }
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  float m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

float max_abs(const Tensor& a) {
  float m = 0;
  for (float v : a.to_vector<float>()) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST(QuantizedModel, LogitsMatchTheDequantizedF32ModelAndDecodeMatchesPrefill) {
  llama::TransformerLM q(tiny_config(), 21), f(tiny_config(), 21);
  quantize_model(q, f);
  const std::vector<int32_t> tokens{5, 17, 90, 3, 3, 64, 12, 40, 77};
  const Tensor ids = Tensor::from_vector<int32_t>({1, 9}, tokens);
  autograd::NoGradGuard no_grad;
  const Tensor lq = q.forward(ids), lf = f.forward(ids);
  ASSERT_EQ(lq.shape(), lf.shape());
  // Only the 8-bit rounding of the activations separates the two (about 1/254 of each block's max,
  // compounded over 2 layers): a few hundredths of the logits' scale, far from the NaN of a wrong path.
  const float diff = max_abs_diff(lq, lf), scale = max_abs(lf);
  EXPECT_LT(diff, 0.03f * scale) << "max |quantized - f32| = " << diff << ", max |logit| = " << scale;
  EXPECT_GT(diff, 0.0f) << "identical logits: are the activations quantized at all?";

  // Decoding through the KV cache, one token at a time (M = 1 kernels), gives the prefill's logits:
  // the kernels quantize each row on its own, so only the attention's summation order differs.
  auto cache = q.make_cache(1);
  std::vector<float> decoded = q.forward_cached(Tensor::from_vector<int32_t>({1, 4}, {5, 17, 90, 3}), cache).to_vector<float>();
  for (size_t i = 4; i < tokens.size(); ++i) {
    auto step = q.forward_cached(Tensor::from_vector<int32_t>({1, 1}, {tokens[i]}), cache).to_vector<float>();
    decoded.insert(decoded.end(), step.begin(), step.end());
  }
  EXPECT_LT(max_abs_diff(Tensor::from_vector<float>(lq.shape(), decoded), lq), 1e-4f * scale);

  // The loss under no-grad goes through the quantized head too (the fused linear_cross_entropy would
  // read the NaN-poisoned f32 head).
  const Tensor targets = Tensor::from_vector<int32_t>({1, 9}, {17, 90, 3, 3, 64, 12, 40, 77, 1});
  const float loss_q = q.loss(ids, targets).item(), loss_f = f.loss(ids, targets).item();
  EXPECT_TRUE(std::isfinite(loss_q));
  EXPECT_NEAR(loss_q, loss_f, 0.02f);
}

TEST(QuantizedModel, BackwardThroughAQuantizedWeightIsRefusedByName) {
  llama::TransformerLM q(tiny_config(), 21), f(tiny_config(), 21);
  quantize_model(q, f);
  const Tensor ids = Tensor::from_vector<int32_t>({1, 3}, {1, 2, 3});
  try {
    q.loss(ids, ids);
    FAIL() << "a recorded forward through quantized weights was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layers.0.attn.q_proj.weight is held quantized (Q4_1) for inference only"), std::string::npos)
        << msg;
  }
}

TEST(QuantizedModel, SetQuantizedChecksShapeAndType) {
  llama::TransformerLM m(tiny_config(), 3);
  nn::Linear& w1 = m.layers[0]->ffn.w1;  // [96, 64]
  std::vector<float> w(64 * 64, 0.5f);
  try {
    w1.set_quantized(std::make_shared<QuantizedMatrix>(QuantizedMatrix::quantize(QuantType::Q8_0, w.data(), 64, 64)));
    FAIL() << "a [64, 64] weight accepted for a [96, 64] layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantized weight is [64, 64] but the layer's weight is [96, 64]"),
              std::string::npos) << e.what();
  }
  std::vector<uint8_t> bytes(96 * 2 * 22, 0);
  try {
    w1.set_quantized(std::make_shared<QuantizedMatrix>(QuantType::Q5_0, 96, 64, bytes.data()));
    FAIL() << "Q5_0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q5_0 weights cannot be multiplied quantized"), std::string::npos) << e.what();
  }
  EXPECT_EQ(w1.quantized, nullptr);
}
