// Fine-tuning data (train/sft_data.h): rendering with the model's ChatML template, the assistant-only
// mask (masked positions get zero gradient), padding that equals running the examples one by one, the
// held-out split, the loader's exact resume, and errors that name the line and the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <unistd.h>

#include "core/autograd.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "models/adapters.h"
#include "models/deepseek_v3/model.h"
#include "models/family.h"
#include "ops/shape.h"
#include "runs/load.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/gguf_files.h"
#include "support/op_test.h"
#include "train/sft_data.h"

namespace fs = std::filesystem;
using namespace loom;
using loom::test::TempDir;

namespace {

using loom::test::chatml_tiny_gguf;
std::string chatml_tiny() { return chatml_tiny_gguf(); }

struct Base {
  runs::LoadedRun loaded = runs::load_weights(chatml_tiny());
  train::SftRenderer renderer = train::SftRenderer::for_model(*loaded.tokenizer, loaded.chat_template, loaded.eos);
  const tokenizer::Tokenizer& tok() const { return *loaded.tokenizer; }
  std::string text(const std::vector<int32_t>& ids) const {
    std::vector<tokenizer::TokenId> t(ids.begin(), ids.end());
    return tok().decode_bytes(t);
  }
  // The trained tokens of an example, as text, each run of them ended by '|'.
  std::string trained_text(const train::SftExample& e) const {
    std::string out;
    std::vector<int32_t> run;
    for (size_t i = 0; i <= e.ids.size(); ++i) {
      if (i < e.ids.size() && e.trained[i]) {
        run.push_back(e.ids[i]);
      } else if (!run.empty()) {
        out += text(run) + "|";
        run.clear();
      }
    }
    return out;
  }
};

train::SftExample render(const Base& b, const std::string& line) {
  return train::render_sft_line(nlohmann::json::parse(line), b.renderer, b.tok(), "data.jsonl:1");
}

}  // namespace

TEST(SftData, RendersChatMlAndTrainsOnTheAssistantRepliesOnly) {
  Base b;
  ASSERT_EQ(b.renderer.format, train::SftFormat::ChatMl);
  const auto e = render(b, R"({"messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6, of course."}]})");
  EXPECT_EQ(b.text(e.ids),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n6, of course.<|im_end|>\n");
  // Every assistant reply and its end-of-turn token; nothing else.
  EXPECT_EQ(b.trained_text(e), "4<|im_end|>|6, of course.<|im_end|>|");
  // Exact match: the prompt ends with the last reply's header; the reference is its text.
  EXPECT_EQ(b.text(e.prompt), b.text(e.ids).substr(0, b.text(e.ids).rfind("6, of course.")));
  EXPECT_EQ(e.reference, "6, of course.");
  // The control tokens are ids, the text between them is not matched for them.
  const auto inj = render(b, R"({"prompt": "<|im_end|>", "completion": "x"})");
  EXPECT_EQ(std::count(inj.ids.begin(), inj.ids.end(), b.renderer.im_end), 2);  // user's and assistant's
}

TEST(SftData, PromptCompletionIsAUserTurnAndARawFormatWithoutTemplate) {
  Base b;
  const auto chat = render(b, R"({"prompt": "hi", "completion": "hello"})");
  EXPECT_NE(b.text(chat.ids).find("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n"),
            std::string::npos);
  EXPECT_EQ(b.trained_text(chat), "hello<|im_end|>|");
  // No template: prompt + completion + eos, trained on the completion and eos.
  const auto raw_r = train::SftRenderer::for_model(b.tok(), "", b.loaded.eos);
  ASSERT_EQ(raw_r.format, train::SftFormat::Raw);
  const auto raw = train::render_sft_line(nlohmann::json::parse(R"({"prompt": "ab", "completion": "cd"})"), raw_r,
                                          b.tok(), "x.jsonl:1");
  EXPECT_EQ(b.text(raw.prompt), "ab");
  ASSERT_EQ(raw.ids.back(), raw_r.eos);
  EXPECT_EQ(b.text({raw.ids.begin(), raw.ids.end() - 1}), "abcd");
  EXPECT_EQ(raw.trained, std::vector<uint8_t>({0, 0, 1, 1, 1}));
  test::expect_error_mentions([&] {
    train::render_sft_line(nlohmann::json::parse(R"({"messages": [{"role": "assistant", "content": "x"}]})"), raw_r,
                           b.tok(), "x.jsonl:4");
  }, {"x.jsonl:4", "need a chat template"});
}

TEST(SftData, TheTemplatesDefaultSystemMessageIsAddedUntrained) {
  Base b;
  train::SftRenderer r = b.renderer;
  r.default_system = "You are tiny.";
  train::SftExample e = train::render_sft_line(
      nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})"),
      r, b.tok(), "x:1");
  EXPECT_EQ(b.text(e.ids).rfind("<|im_start|>system\nYou are tiny.<|im_end|>\n<|im_start|>user\nq", 0), 0u);
  EXPECT_EQ(b.trained_text(e), "a<|im_end|>|");
}

TEST(SftData, BadLinesNameTheFileLineAndField) {
  Base b;
  TempDir dir;
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"{not json", {"data.jsonl:2", "not valid JSON"}},
      {R"([1, 2])", {"data.jsonl:2", "must be a JSON object"}},
      {R"({"text": "x"})", {"data.jsonl:2", "needs \"messages\", or \"prompt\" and \"completion\""}},
      {R"({"messages": []})", {"data.jsonl:2", "messages must be a non-empty array"}},
      {R"({"messages": [{"role": "user"}]})", {"data.jsonl:2", "messages[0].content is missing"}},
      {R"({"messages": [{"role": "user", "content": 5}]})", {"data.jsonl:2", "messages[0].content must be a string, got 5"}},
      {R"({"messages": [{"role": "bot", "content": "x"}]})", {"data.jsonl:2", "messages[0].role must be", "got \"bot\""}},
      {R"({"messages": [{"role": "user", "content": "x"}]})", {"data.jsonl:2", "no assistant message"}},
      {R"({"prompt": "x"})", {"data.jsonl:2", "completion is missing"}},
      {R"({"prompt": "x", "completion": ["y"]})", {"data.jsonl:2", "completion must be a string"}},
      {R"({"prompt": ")" + std::string(200, 'x') + R"(", "completion": "y"})", {"data.jsonl:2", "more than the model's context length of 128"}},
  };
  for (const auto& [bad, parts] : cases) {
    SCOPED_TRACE(bad);
    const std::string path = dir / "data.jsonl";
    test::write_file(path, R"({"prompt": "a", "completion": "b"})" "\n" + bad + "\n");
    std::vector<std::string> want = parts;
    want[0] = path.substr(0, path.size() - 10) + parts[0];  // the path as given
    test::expect_error_mentions([&] { train::read_sft_file(path, b.renderer, b.tok(), 128); }, want);
  }
  // Blank lines are skipped (and counted): the error's line number is the file's.
  const std::string path = dir / "blank.jsonl";
  test::write_file(path, "\n\n{\"prompt\": 1}\n");
  test::expect_error_mentions([&] { train::read_sft_file(path, b.renderer, b.tok(), 128); }, {"blank.jsonl:3: prompt must be a string"});
}

TEST(SftData, MaskedPositionsGetZeroGradient) {
  Base b;
  std::vector<train::SftExample> ex = {render(b, R"({"prompt": "abc", "completion": "de"})"),
                                      render(b, R"({"prompt": "a much longer prompt", "completion": "f"})")};
  const data::Batch batch = train::sft_batch({&ex[0], &ex[1]});
  const int64_t B = batch.targets.size(0), T = batch.targets.size(1), V = b.loaded.model->vocab_size();
  Tensor logits = test::param(test::randn({B, T, V}, 5));
  Tensor loss = ops::cross_entropy(logits, batch.targets, train::kIgnoreTarget);
  loss.backward();
  const float* g = logits.grad().data<float>();
  const int32_t* t = batch.targets.data<int32_t>();
  int64_t trained = 0, masked = 0;
  for (int64_t i = 0; i < B * T; ++i) {
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::fabs(g[i * V + v]);
    if (t[i] == train::kIgnoreTarget) {
      EXPECT_EQ(sum, 0.0) << "masked position " << i << " got a gradient";
      ++masked;
    } else {
      EXPECT_GT(sum, 0.0) << "trained position " << i;
      ++trained;
    }
  }
  EXPECT_EQ(trained, ex[0].trained_tokens() + ex[1].trained_tokens());
  EXPECT_GT(masked, trained);  // prompts, headers and the padding of the shorter row
}

namespace {
// Each example alone in its batch: the token-weighted sum of their losses (scaled back to a mean by the
// caller), the number of trained tokens, and the sum of the token-weighted gradients of `params`.
struct OneByOne {
  double loss_sum = 0;
  int64_t tokens = 0;
  std::vector<std::vector<float>> grads;
};
OneByOne run_one_by_one(models::LanguageModel& model, const std::vector<nn::Parameter*>& params,
                        const std::vector<train::SftExample>& ex) {
  OneByOne r;
  r.grads.resize(params.size());
  for (const auto& e : ex) {
    for (nn::Parameter* p : params) p->value.set_grad(Tensor());
    const data::Batch one = train::sft_batch({&e});
    Tensor l = model.loss(one.inputs, one.targets);
    const auto n = e.trained_tokens();
    ops::scale(l, static_cast<float>(n)).backward();
    r.loss_sum += l.item() * static_cast<double>(n);
    r.tokens += n;
    for (size_t i = 0; i < params.size(); ++i) {
      // A parameter the loss does not reach (DeepSeek-V3's MTP module under the evaluation loss) has none.
      const Tensor grad = params[i]->value.grad();
      auto g = grad.defined() ? grad.to_vector<float>() : std::vector<float>(static_cast<size_t>(params[i]->value.numel()), 0.0f);
      if (r.grads[i].empty()) r.grads[i].assign(g.size(), 0.0f);
      for (size_t k = 0; k < g.size(); ++k) r.grads[i][k] += g[k];
    }
  }
  return r;
}
}  // namespace

TEST(SftData, APaddedBatchEqualsTheExamplesRunOneByOne) {
  Base b;
  auto& model = *b.loaded.model;
  std::vector<train::SftExample> ex = {render(b, R"({"prompt": "abc", "completion": "de"})"),
                                      render(b, R"({"prompt": "a much longer prompt here", "completion": "fgh"})"),
                                      render(b, R"({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "v w"}]})")};
  std::vector<nn::Parameter*> params = model.parameters();
  // Token-weighted sum of the separate losses and their gradients.
  auto [want_loss, tokens, want_grads] = run_one_by_one(model, params, ex);
  for (nn::Parameter* p : params) p->value.set_grad(Tensor());
  const data::Batch all = train::sft_batch({&ex[0], &ex[1], &ex[2]});
  Tensor l = model.loss(all.inputs, all.targets);
  ops::scale(l, static_cast<float>(tokens)).backward();
  EXPECT_NEAR(l.item(), want_loss / static_cast<double>(tokens), 2e-6);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor want = Tensor::from_vector<float>(params[i]->value.shape(), want_grads[i]);
    test::expect_close(params[i]->value.grad(), want, 2e-5f, 1e-4f, params[i]->name);
  }
}

namespace {
// Token-weighted loss and gradients of `examples` run one by one (each alone in its batch) against the
// same examples packed into rows of `row_length` (sft_packed_batch): positions restart per example and
// attention does not cross examples, so they must agree.
void expect_packed_equals_separate(models::LanguageModel& model, const std::vector<train::SftExample>& ex,
                                   int64_t row_length, int64_t want_rows) {
  std::vector<nn::Parameter*> params = model.parameters();
  for (nn::Parameter* p : params) p->value.set_requires_grad(true);
  auto [want_loss, tokens, want_grads] = run_one_by_one(model, params, ex);
  for (nn::Parameter* p : params) p->value.set_grad(Tensor());
  std::vector<const train::SftExample*> ptrs;
  for (const auto& e : ex) ptrs.push_back(&e);
  const data::Batch packed = train::sft_packed_batch(ptrs, row_length);
  ASSERT_EQ(packed.inputs.size(0), want_rows);
  models::ForwardContext ctx;
  ctx.positions = packed.positions;
  ctx.key_begin = packed.key_begin;
  Tensor l = model.loss(packed.inputs, packed.targets, ctx);
  ops::scale(l, static_cast<float>(tokens)).backward();
  EXPECT_NEAR(l.item(), want_loss / static_cast<double>(tokens), 2e-6);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor want = Tensor::from_vector<float>(params[i]->value.shape(), want_grads[i]);
    const Tensor g = params[i]->value.grad();
    test::expect_close(g.defined() ? g : Tensor::zeros(want.shape()), want, 2e-5f, 1e-4f, params[i]->name);
  }
  // Without the document mask and positions the packed row is one long sequence: a different loss
  // (the check above is not vacuous).
  EXPECT_GT(std::fabs(model.loss(packed.inputs, packed.targets).item() - l.item()), 1e-4);
}

// Examples of `lengths` ids over a vocabulary of 64, the second half of each trained.
std::vector<train::SftExample> synthetic_examples(const std::vector<int64_t>& lengths) {
  std::vector<train::SftExample> out;
  uint32_t x = 12345;
  for (size_t k = 0; k < lengths.size(); ++k) {
    train::SftExample e;
    e.line = static_cast<int64_t>(k + 1);
    for (int64_t i = 0; i < lengths[k]; ++i) {
      x = x * 1664525u + 1013904223u;
      e.ids.push_back(static_cast<int32_t>(1 + (x >> 16) % 63));
      e.trained.push_back(i >= lengths[k] / 2 ? 1 : 0);
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::unique_ptr<models::LanguageModel> tiny_model(const std::string& arch, const nlohmann::json& shape) {
  nlohmann::json j = models::family(arch).defaults;
  j.update(shape);
  j["arch"] = arch;
  return models::family(arch).build(models::ModelConfig::from_json(j), 7);
}
}  // namespace

// Packing (data.packing): examples of 40, 150 and 90 positions in rows of 200 make two rows (40 + 150,
// then 90), documents crossing the attention kernels' 128-key blocks and starting mid-block.
TEST(SftData, APackedBatchEqualsTheExamplesRunSeparatelyLlama) {
  auto model = tiny_model("llama", {{"vocab_size", 64}, {"context_length", 256}, {"d_model", 32}, {"num_layers", 2},
                                    {"num_heads", 4}, {"num_kv_heads", 2}, {"d_ff", 48}});
  expect_packed_equals_separate(*model, synthetic_examples({41, 151, 91}), 200, 2);
}

TEST(SftData, APackedBatchEqualsTheExamplesRunSeparatelyGpt2) {
  auto model = tiny_model("gpt2", {{"vocab_size", 64}, {"context_length", 256}, {"d_model", 32}, {"num_layers", 2},
                                   {"num_heads", 4}});
  expect_packed_equals_separate(*model, synthetic_examples({41, 151, 91}), 200, 2);
}

// DeepSeek-V3: MLA attends within each document (its scaled_dot_product_attention with key_begin) and
// rotates by the documents' positions, and the MTP module's training loss predicts within documents only.
// The routed experts carry adapters, so the packed rows run through them too. (Eval loss: the main
// cross-entropy; the balance loss, which counts a row's positions as one sequence, is not compared.)
TEST(SftData, APackedBatchEqualsTheExamplesRunSeparatelyDeepSeekV3) {
  auto model = tiny_model("deepseek_v3", {{"vocab_size", 64}, {"context_length", 256}, {"d_model", 32},
                                          {"num_layers", 2}, {"num_heads", 2}, {"q_rank", 16}, {"kv_rank", 8},
                                          {"d_nope", 8}, {"d_rope", 4}, {"d_v", 8}, {"d_ff", 48}, {"n_routed", 4},
                                          {"top_k", 2}, {"d_expert", 16}, {"n_mtp", 1}});
  models::AdapterConfig a;
  a.lora.rank = 2;
  a.targets = {"all-linear"};
  for (nn::LoRA* l : models::attach_adapters(*model, a, RngKey::from_seed(2))) {
    l->B.value.copy_from(test::randn(l->B.value.shape(), 3, 0.05f));
  }
  const auto ex = synthetic_examples({41, 151, 91});
  expect_packed_equals_separate(*model, ex, 200, 2);

  // The MTP part of the training objective: module 1 scores position t when t + 1 is trained and in t's
  // document, so its packed mean is the separate means weighted by their scored positions.
  auto& ds = dynamic_cast<deepseek_v3::DeepSeekV3&>(*model);
  std::vector<nn::Parameter*> params = model->parameters();
  const models::ForwardContext training = models::ForwardContext::train(RngKey::from_seed(1));
  double want = 0;
  int64_t scored = 0;
  std::vector<std::vector<float>> want_grads(params.size());
  for (const auto& e : ex) {
    for (nn::Parameter* p : params) p->value.set_grad(Tensor());
    const data::Batch one = train::sft_batch({&e});
    const auto t = ops::narrow(one.targets, 1, 1, one.targets.size(1) - 1).to_vector<int32_t>();
    const auto n = std::count_if(t.begin(), t.end(), [](int32_t v) { return v != train::kIgnoreTarget; });
    Tensor mtp = ds.losses(one.inputs, one.targets, training).mtp;
    ops::scale(mtp, static_cast<float>(n)).backward();
    want += mtp.item() * static_cast<double>(n);
    scored += n;
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor g = params[i]->value.grad();
      auto v = g.defined() ? g.to_vector<float>() : std::vector<float>(static_cast<size_t>(params[i]->value.numel()), 0.0f);
      if (want_grads[i].empty()) want_grads[i].assign(v.size(), 0.0f);
      for (size_t k = 0; k < v.size(); ++k) want_grads[i][k] += v[k];
    }
  }
  for (nn::Parameter* p : params) p->value.set_grad(Tensor());
  const data::Batch packed = train::sft_packed_batch({&ex[0], &ex[1], &ex[2]}, 200);
  models::ForwardContext ctx = training;
  ctx.positions = packed.positions;
  ctx.key_begin = packed.key_begin;
  Tensor mtp = ds.losses(packed.inputs, packed.targets, ctx).mtp;
  ops::scale(mtp, static_cast<float>(scored)).backward();
  EXPECT_NEAR(mtp.item(), want / static_cast<double>(scored), 2e-6);
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor g = params[i]->value.grad();
    Tensor w = Tensor::from_vector<float>(params[i]->value.shape(), want_grads[i]);
    test::expect_close(g.defined() ? g : Tensor::zeros(w.shape()), w, 2e-5f, 1e-4f, "mtp " + params[i]->name);
  }
}

TEST(SftData, PackedRowsRestartPositionsAndPadAsADocumentOfTheirOwn) {
  auto ex = synthetic_examples({5, 4, 6});  // 4, 3 and 5 positions
  const data::Batch b = train::sft_packed_batch({&ex[0], &ex[1], &ex[2]}, 8);
  // First fit: [0: 4 positions, 1: 3 positions] then [2: 5 positions], rows padded to 7.
  ASSERT_EQ(b.inputs.shape(), (Shape{2, 7}));
  EXPECT_EQ(b.positions.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 0, 1}));
  EXPECT_EQ(b.key_begin.to_vector<int32_t>(), (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 0, 0, 0, 0, 0, 5, 5}));
  EXPECT_EQ(b.inputs.to_vector<int32_t>()[4], ex[1].ids[0]);
  EXPECT_EQ(b.targets.to_vector<int32_t>()[12], train::kIgnoreTarget);  // padding
  test::expect_error_mentions([&] { train::sft_packed_batch({&ex[2]}, 4); }, {"5 positions", "row of 4"});
}

TEST(SftData, TheHeldOutSplitIsSeededAndDisjoint) {
  std::vector<train::SftExample> ex(20);
  for (size_t i = 0; i < ex.size(); ++i) ex[i].line = static_cast<int64_t>(i + 1);
  auto lines = [](const std::vector<train::SftExample>& v) {
    std::vector<int64_t> out;
    for (const auto& e : v) out.push_back(e.line);
    return out;
  };
  const auto a = train::split_sft(ex, 0.2, RngKey::from_seed(1));
  const auto a2 = train::split_sft(ex, 0.2, RngKey::from_seed(1));
  const auto c = train::split_sft(ex, 0.2, RngKey::from_seed(2));
  EXPECT_EQ(a.train.size(), 16u);
  EXPECT_EQ(a.held_out.size(), 4u);
  EXPECT_EQ(lines(a.held_out), lines(a2.held_out));
  EXPECT_NE(lines(a.held_out), lines(c.held_out));
  auto held = lines(a.held_out);
  for (int64_t l : lines(a.train)) EXPECT_EQ(std::count(held.begin(), held.end(), l), 0);
  EXPECT_TRUE(std::is_sorted(held.begin(), held.end()));
  EXPECT_EQ(train::split_sft(ex, 0.0, RngKey{}).held_out.size(), 0u);
  EXPECT_EQ(train::split_sft(ex, 0.01, RngKey{}).held_out.size(), 1u);  // at least one
}

TEST(SftData, TheLoaderWalksEpochsInSeededOrderAndResumesExactly) {
  Base b;
  std::vector<train::SftExample> ex;
  for (int i = 0; i < 7; ++i) ex.push_back(render(b, R"({"prompt": "p)" + std::to_string(i) + R"(", "completion": "c"})"));
  train::SftLoader a(ex, 3, RngKey::from_seed(4));
  std::vector<data::Batch> seq;
  for (int i = 0; i < 8; ++i) seq.push_back(a.next());  // 3, 3, 1 per epoch
  EXPECT_EQ(seq[0].inputs.size(0), 3);
  EXPECT_EQ(seq[2].inputs.size(0), 1);
  EXPECT_EQ(seq[3].inputs.size(0), 3);
  // Restoring a state mid-epoch continues with the same batches.
  train::SftLoader r(ex, 3, RngKey::from_seed(4));
  for (int i = 0; i < 4; ++i) r.next();
  const auto state = nlohmann::json(r.state_json());
  train::SftLoader c(ex, 3, RngKey::from_seed(4));
  c.restore(train::SftLoader::state_from_json(state));
  for (int i = 4; i < 8; ++i) test::expect_bitwise(c.next().inputs, seq[static_cast<size_t>(i)].inputs, "batch " + std::to_string(i));
}
