// Fine-tuning (train/finetune.h) on the tiny ChatML Llama: only the adapters train and are checkpointed,
// a run resumes bit for bit, PEFT's files round-trip with PEFT's names, merging keeps the function.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <filesystem>

#include <unistd.h>
#include <set>
#include <sstream>

#include "core/autograd.h"
#include "io/safetensors.h"
#include "models/adapters.h"
#include "models/deepseek_v3/model.h"
#include "models/gguf.h"
#include "ops/shape.h"
#include "models/tensor_names.h"
#include "models/llama/names.h"
#include "runs/checkpoint.h"
#include "runs/load.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/gguf_files.h"
#include "support/op_test.h"
#include "train/config.h"
#include "train/finetune.h"
#include "tokenizer/formats.h"

namespace fs = std::filesystem;
using namespace loom;
using loom::test::TempDir;

namespace {

using loom::test::chatml_tiny_gguf;
std::string chatml_tiny() { return chatml_tiny_gguf(); }

// A small task: reverse a three-letter word.
std::string write_data(const TempDir& dir, int n = 24) {
  std::string text;
  const std::string letters = "abcdefghij";
  for (int i = 0; i < n; ++i) {
    std::string w = {letters[static_cast<size_t>(i % 10)], letters[static_cast<size_t>((i * 3 + 1) % 10)],
                     letters[static_cast<size_t>((i * 7 + 2) % 10)]};
    std::string r(w.rbegin(), w.rend());
    text += R"({"messages": [{"role": "user", "content": "reverse )" + w + R"("}, {"role": "assistant", "content": ")" +
            r + "\"}]}\n";
  }
  const std::string path = dir / "data.jsonl";
  test::write_file(path, text);
  return path;
}

train::FinetuneConfig tiny_config(const std::string& data) {
  train::FinetuneConfig c;
  c.weights = chatml_tiny();
  c.data = data;
  c.val_fraction = 0.25;
  c.adapter.lora.rank = 4;
  c.adapter.lora.alpha = 8;
  c.adapter.lora.dropout = 0.1f;  // exercised by the resume check
  c.adapter.targets = {"q_proj", "v_proj", "gate_proj"};
  c.lr = 1e-2;
  c.max_steps = 6;
  c.batch_size = 4;
  c.grad_accum_steps = 2;
  c.eval_interval = 3;
  c.exact_match = 2;
  c.max_new_tokens = 8;
  c.checkpoint_interval = 3;
  c.keep_last = 0;
  c.log_interval = 1;
  c.progress = "none";
  c.threads = 2;
  return c;
}

std::vector<Tensor> values(const std::vector<nn::Parameter*>& ps) {
  std::vector<Tensor> out;
  for (auto* p : ps) out.push_back(p->value.clone());
  return out;
}

}  // namespace

TEST(Finetune, TrainsOnlyTheAdaptersAndCheckpointsOnlyThem) {
  TempDir dir;
  train::Finetuner f(tiny_config(write_data(dir)), dir / "run");
  auto& model = f.model();
  std::vector<nn::Parameter*> base;
  for (nn::Parameter* p : model.parameters()) {
    if (p->name.find(".lora_") == std::string::npos) base.push_back(p);
  }
  const auto before = values(base);
  // 2 layers x (q_proj, v_proj, w1) x (A, B).
  ASSERT_EQ(f.optimizer().params().size(), 12u);
  for (nn::Parameter* p : f.optimizer().params()) EXPECT_NE(p->name.find(".lora_"), std::string::npos) << p->name;
  EXPECT_EQ(models::adapters_of(model).size(), 6u);
  EXPECT_EQ(models::adapters_of(model)[0]->A.name, "layers.0.attn.q_proj.lora_A.weight");
  EXPECT_EQ(models::adapters_of(model)[2]->A.name, "layers.0.ffn.w1.lora_A.weight");  // gate_proj: HF's name for w1
  const auto s = f.run();
  EXPECT_EQ(s.steps_completed, 6);
  ASSERT_TRUE(s.first_val_loss && s.last_val_loss);
  EXPECT_LT(*s.last_val_loss, *s.first_val_loss);
  for (size_t i = 0; i < base.size(); ++i) {
    test::expect_bitwise(base[i]->value, before[i], base[i]->name + " (frozen)");
    EXPECT_FALSE(base[i]->value.grad().defined()) << base[i]->name;
  }
  for (nn::LoRA* a : models::adapters_of(model)) {
    const auto b = a->B.value.to_vector<float>();
    EXPECT_TRUE(std::any_of(b.begin(), b.end(), [](float v) { return v != 0.0f; })) << a->layer << ": B never moved";
  }
  // The checkpoint holds the adapters and their moments only.
  const auto ck = runs::list_checkpoints(dir / "run");
  ASSERT_EQ(ck.size(), 2u);
  const auto adapter = io::SafetensorsFile::open(ck.back().path + "/adapter.safetensors");
  EXPECT_EQ(adapter.size(), 12u);
  const auto opt = io::SafetensorsFile::open(ck.back().path + "/optimizer.safetensors");
  EXPECT_EQ(opt.size(), 1u + 2 * 12u);
  EXPECT_FALSE(fs::exists(ck.back().path + "/model.safetensors"));
}

namespace {
// A run of `c` resumed by a fresh Finetuner from its step-3 checkpoint ends with the uninterrupted run's
// adapter and moment bits and metrics lines.
void expect_resumes_bit_for_bit(const TempDir& dir, const train::FinetuneConfig& c) {
  train::Finetuner whole(c, dir / "whole");
  whole.run();
  // Another run of the same config, continued by a fresh Finetuner from its step-3 checkpoint.
  { train::Finetuner(c, dir / "split").run(); }
  train::Finetuner resumed(c, dir / "split");
  runs::CheckpointRef ref = runs::list_checkpoints(dir / "split").front();
  ASSERT_EQ(ref.step, 3);
  resumed.load_checkpoint(ref.path);
  EXPECT_EQ(resumed.step(), 3);
  resumed.run();
  auto a = models::adapters_of(whole.model()), b = models::adapters_of(resumed.model());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    test::expect_bitwise(b[i]->A.value, a[i]->A.value, a[i]->A.name);
    test::expect_bitwise(b[i]->B.value, a[i]->B.value, a[i]->B.name);
  }
  for (size_t i = 0; i < whole.optimizer().params().size(); ++i) {
    test::expect_bitwise(resumed.optimizer().exp_avg(i), whole.optimizer().exp_avg(i), "exp_avg");
    test::expect_bitwise(resumed.optimizer().exp_avg_sq(i), whole.optimizer().exp_avg_sq(i), "exp_avg_sq");
  }
  // metrics.jsonl of the resumed run reads as the uninterrupted one's.
  auto losses = [](const std::string& path) {
    std::vector<std::string> out;
    std::istringstream in(test::read_file(path));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("loss")) out.push_back(j.at("loss").dump());
    }
    return out;
  };
  EXPECT_EQ(losses(dir / "split/metrics.jsonl"), losses(dir / "whole/metrics.jsonl"));
}
}  // namespace

TEST(Finetune, ATinyRunResumesBitForBit) {
  TempDir dir;
  expect_resumes_bit_for_bit(dir, tiny_config(write_data(dir)));
}

TEST(Finetune, APackedRunResumesBitForBit) {
  TempDir dir;
  train::FinetuneConfig c = tiny_config(write_data(dir));
  c.packing = true;
  expect_resumes_bit_for_bit(dir, c);
}

TEST(Finetune, APackedRunFollowsTheUnpackedOne) {
  // Packing keeps each step's examples and trained tokens: without dropout (whose masks are drawn over
  // the rows' layout) the packed run is the unpacked one up to rounding.
  TempDir dir;
  train::FinetuneConfig c = tiny_config(write_data(dir));
  c.adapter.lora.dropout = 0;
  c.exact_match = 0;
  c.checkpoint_interval = 0;
  train::Finetuner padded(c, dir / "padded");
  const auto sp = padded.run();
  c.packing = true;
  train::Finetuner packed(c, dir / "packed");
  const data::Batch first = train::SftLoader(packed.train_examples(), c.batch_size, RngKey::from_seed(1), 1000).next();
  ASSERT_TRUE(first.key_begin.defined());
  const auto sk = packed.run();
  ASSERT_TRUE(sp.last_val_loss && sk.last_val_loss);
  EXPECT_NEAR(*sk.first_val_loss, *sp.first_val_loss, 1e-5);
  EXPECT_NEAR(*sk.last_val_loss, *sp.last_val_loss, 1e-4);
  EXPECT_NE(*sk.last_val_loss, *sk.first_val_loss);
  auto a = models::adapters_of(padded.model()), b = models::adapters_of(packed.model());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) test::expect_close(b[i]->B.value, a[i]->B.value, 1e-4f, 1e-3f, a[i]->B.name);
}

TEST(Finetune, PeftFilesRoundTripWithPeftsNamesAndMergingKeepsTheFunction) {
  TempDir dir;
  train::FinetuneConfig c = tiny_config(write_data(dir));
  c.adapter.targets = {"all-linear"};
  train::Finetuner f(c, dir / "run");
  f.run();
  f.save_outputs();
  const std::string adapter = dir / "run/adapter";
  const auto cfg = test::read_json(adapter + "/adapter_config.json");
  EXPECT_EQ(cfg["peft_type"], "LORA");
  EXPECT_EQ(cfg["r"], 4);
  EXPECT_EQ(cfg["lora_alpha"], 8.0);
  EXPECT_EQ(cfg["target_modules"], nlohmann::json({"down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"}));
  const auto file = io::SafetensorsFile::open(adapter + "/adapter_model.safetensors");
  EXPECT_EQ(file.size(), 2u * 7u * 2u);
  ASSERT_TRUE(file.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
  ASSERT_TRUE(file.contains("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  // q_proj's B rows are in HF's rotate-half order, as the base weight's are; A is loom's.
  nn::Linear& q = *models::linear_layers(f.model())[0];
  ASSERT_EQ(q.name(), "layers.0.attn.q_proj");
  test::expect_bitwise(file.tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), q.lora->A.value, "A");
  const auto rows = llama::tensor_names().rows[2].how.rope(f.model().model_config().json());
  test::expect_bitwise(file.tensor("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"),
                       models::reorder_rope_rows(q.lora->B.value, rows, false), "B rotate-half");

  // Loaded onto a fresh base: the same logits.
  const Tensor ids = Tensor::from_vector<int32_t>({1, 6}, {5, 9, 13, 40, 41, 42});
  autograd::NoGradGuard no_grad;
  const Tensor want = f.model().logits(ids);
  auto fresh = runs::load_weights(chatml_tiny());
  const auto loaded = models::load_peft_adapter(*fresh.model, adapter);
  EXPECT_EQ(loaded.lora.rank, 4);
  EXPECT_EQ(models::adapters_of(*fresh.model).size(), 14u);
  test::expect_bitwise(fresh.model->logits(ids), want, "logits with PEFT's adapter loaded");
  // Merged into the base: the same function as plain layers.
  models::merge_adapters(*fresh.model);
  EXPECT_TRUE(models::adapters_of(*fresh.model).empty());
  test::expect_close(fresh.model->logits(ids), want, 2e-5f, 1e-4f, "merged logits");
  // Through `loom merge`'s function: a run that loads and computes the same.
  train::merge_adapter_run(chatml_tiny(), adapter, dir / "merged", false);
  auto merged = runs::load_run(dir / "merged");
  test::expect_close(merged.model->logits(ids), want, 2e-5f, 1e-4f, "merged run logits");
  EXPECT_TRUE(fs::exists(dir / "merged/tokenizer_config.json"));
}

TEST(Finetune, FullFineTuningTrainsEveryWeight) {
  TempDir dir;
  train::FinetuneConfig c = tiny_config(write_data(dir));
  c.full = true;
  c.lr = 1e-3;
  c.max_steps = 3;
  c.exact_match = 0;
  train::Finetuner f(c, dir / "run");
  EXPECT_TRUE(models::adapters_of(f.model()).empty());
  EXPECT_EQ(f.optimizer().params().size(), f.model().parameters().size());
  const Tensor before = f.model().parameter("layers.0.attn.q_proj.weight").value.clone();
  const auto s = f.run();
  EXPECT_LT(*s.last_val_loss, *s.first_val_loss);
  EXPECT_FALSE(test::bitwise_equal(f.model().parameter("layers.0.attn.q_proj.weight").value, before));
  f.save_outputs();
  auto run = runs::load_run(dir / "run");  // a run loom chat / export read
  EXPECT_TRUE(run.tokenizer.has_value());
}

TEST(Finetune, ConfigErrorsNameTheKey) {
  test::expect_error_mentions([] { train::FinetuneConfig::with_overrides({}, {"lora.rnak=4"}); }, {"unknown key lora.rnak"});
  test::expect_error_mentions([] { train::FinetuneConfig::with_overrides({}, {"base.weights=x", "data.train=y", "lora.rank=0"}); },
                              {"lora.rank must be positive"});
  test::expect_error_mentions([] { train::FinetuneConfig::with_overrides({}, {"data.train=y"}); }, {"base.weights"});
  auto c = train::FinetuneConfig::with_overrides({}, {"base.weights=m.gguf", "data.train=123", "lora.targets=q_proj,o_proj"});
  EXPECT_EQ(c.data, "123");
  EXPECT_EQ(c.adapter.targets, std::vector<std::string>({"q_proj", "o_proj"}));
  TempDir dir;
  auto bad = tiny_config(write_data(dir));
  bad.adapter.targets = {"qproj"};
  test::expect_error_mentions([&] { train::Finetuner(bad, dir / "r"); }, {"target 'qproj' matches no layer", "q_proj", "w1", "gate_proj"});
}

TEST(Finetune, AQuantizedBaseTrainsAsItsDequantizedTwinAndHoldsNoF32Copy) {
  TempDir dir;
  const std::string data = write_data(dir);
  train::FinetuneConfig c = tiny_config(data);
  c.max_steps = 3;
  c.exact_match = 1;
  c.adapter.targets = {"all-linear"};
  train::Finetuner f32(c, dir / "f32");
  c.quantized = true;
  train::Finetuner q(c, dir / "q");
  int64_t quantized = 0;
  for (nn::Linear* l : models::linear_layers(q.model())) {
    if (!l->quantized) continue;
    ++quantized;
    EXPECT_EQ(l->weight.value.numel(), 0) << l->name() << " kept its f32 copy";
  }
  EXPECT_GT(quantized, 4);  // the fixture's Q8_0 and Q4_1 matrices
  const auto a = f32.run(), b = q.run();
  EXPECT_NEAR(*b.first_val_loss, *a.first_val_loss, 1e-5);
  EXPECT_NEAR(*b.last_val_loss, *a.last_val_loss, 1e-4);
  EXPECT_NEAR(b.last_loss, a.last_loss, 1e-4);
  auto fa = models::adapters_of(f32.model()), fb = models::adapters_of(q.model());
  ASSERT_EQ(fa.size(), fb.size());
  for (size_t i = 0; i < fa.size(); ++i) test::expect_close(fb[i]->B.value, fa[i]->B.value, 1e-4f, 1e-3f, fa[i]->B.name);
  c.full = true;
  test::expect_error_mentions([&] { c.validate(); }, {"base.quantized", "LoRA adapters only"});
}

TEST(Finetune, DeepSeekV3TakesAdaptersOnItsAttentionAndMlpsAndMergesThem) {
  // The seed's tiny DeepSeek-V3 (1 dense + 1 MoE layer, one MTP module): every linear layer but the router
  // and the head, under loom's and HF's names, trains and merges into the same function.
  const auto cfg = train::TrainConfig::load("dsv3-tiny");
  auto model = cfg.model.build(3);
  models::AdapterConfig a;
  a.lora.rank = 2;
  a.targets = {"all-linear"};
  auto adapters = models::attach_adapters(*model, a, RngKey::from_seed(4));
  std::set<std::string> names;
  for (nn::LoRA* l : adapters) names.insert(l->layer);
  EXPECT_TRUE(names.count("layers.0.attn.wkv_b"));
  EXPECT_TRUE(names.count("layers.1.moe.shared.w2"));
  EXPECT_TRUE(names.count("layers.1.moe.experts.w1"));  // all-linear takes the routed experts too, as PEFT would
  EXPECT_TRUE(names.count("layers.1.moe.experts.w2"));
  EXPECT_FALSE(names.count("layers.1.moe.router"));
  EXPECT_FALSE(names.count("lm_head"));
  for (nn::LoRA* l : adapters) l->B.value.copy_from(test::randn(l->B.value.shape(), 5, 0.05f));
  const auto trained = models::freeze_all_but_adapters(*model);
  Tensor ids = Tensor::from_vector<int32_t>({2, 8}, {1, 5, 9, 2, 7, 3, 8, 4, 6, 2, 5, 1, 9, 3, 7, 2});
  Tensor targets = Tensor::from_vector<int32_t>({2, 8}, {5, 9, 2, 7, 3, 8, 4, -100, 2, 5, 1, 9, 3, 7, 2, -100});
  model->loss(ids, targets, models::ForwardContext::train(RngKey::from_seed(6))).backward();
  for (nn::Parameter* p : trained) EXPECT_TRUE(p->value.grad().defined()) << p->name;
  for (nn::Parameter* p : model->parameters()) {
    if (p->name.find(".lora_") == std::string::npos) {
      EXPECT_FALSE(p->value.grad().defined()) << p->name;
    }
  }
  // PEFT's names for MLA: q_b_proj's B rows in the interleaved order HF's DeepSeek-V3 stores.
  bool q_b = false;
  for (const auto& [name, t] : models::peft_adapter_tensors(*model)) q_b |= name == "base_model.model.model.layers.0.self_attn.q_b_proj.lora_B.weight";
  EXPECT_TRUE(q_b);
  autograd::NoGradGuard no_grad;
  const Tensor want = model->logits(ids);
  // PEFT's layout round-trips onto a fresh base, the experts' adapters one pair per expert.
  TempDir dir;
  models::save_peft_adapter(*model, a, "dsv3-tiny", dir / "adapter");
  auto fresh = cfg.model.build(3);
  models::load_peft_adapter(*fresh, dir / "adapter");
  test::expect_bitwise(fresh->logits(ids), want, "logits with the adapter loaded onto a fresh base");
  models::merge_adapters(*model);
  test::expect_close(model->logits(ids), want, 2e-5f, 1e-4f, "merged DeepSeek-V3 logits");
}

TEST(Finetune, DeepSeekV3ExpertAdaptersArePeftModulesPerExpertAndMergeBitForBit) {
  const auto cfg = train::TrainConfig::load("dsv3-tiny");  // 4 routed experts of d_expert 16, d_model 32
  auto model = cfg.model.build(3);
  models::AdapterConfig a;
  a.lora.rank = 2;
  a.targets = {"experts"};
  auto adapters = models::attach_adapters(*model, a, RngKey::from_seed(4));
  ASSERT_EQ(adapters.size(), 3u);  // w1, w3, w2 of the one MoE layer
  EXPECT_EQ(adapters[0]->A.name, "layers.1.moe.experts.w1.lora_A.weight");
  EXPECT_EQ(adapters[0]->A.value.shape(), (Shape{4, 2, 32}));
  EXPECT_EQ(adapters[2]->B.value.shape(), (Shape{4, 32, 2}));
  for (nn::LoRA* l : adapters) l->B.value.copy_from(test::randn(l->B.value.shape(), 5, 0.05f));
  const auto tensors = models::peft_adapter_tensors(*model);
  ASSERT_EQ(tensors.size(), 3u * 4u * 2u);
  std::map<std::string, Tensor> by_name(tensors.begin(), tensors.end());
  const Tensor b = by_name.at("base_model.model.model.layers.1.mlp.experts.3.down_proj.lora_B.weight");
  EXPECT_EQ(b.shape(), (Shape{32, 2}));
  test::expect_bitwise(b, ops::reshape(adapters[2]->B.value.slice(3, 1), {32, 2}), "expert 3's down_proj B");
  EXPECT_EQ(models::peft_adapter_config(*model, a, "x")["target_modules"],
            nlohmann::json({"model.layers.1.mlp.experts.0.down_proj", "model.layers.1.mlp.experts.0.gate_proj",
                            "model.layers.1.mlp.experts.0.up_proj", "model.layers.1.mlp.experts.1.down_proj",
                            "model.layers.1.mlp.experts.1.gate_proj", "model.layers.1.mlp.experts.1.up_proj",
                            "model.layers.1.mlp.experts.2.down_proj", "model.layers.1.mlp.experts.2.gate_proj",
                            "model.layers.1.mlp.experts.2.up_proj", "model.layers.1.mlp.experts.3.down_proj",
                            "model.layers.1.mlp.experts.3.gate_proj", "model.layers.1.mlp.experts.3.up_proj"}));
  test::expect_error_mentions([&] { a.targets = {"expert"}; models::attach_adapters(*cfg.model.build(3), a, RngKey{}); },
                              {"'expert' matches no layer", "experts"});
  // The forward multiplies by W + s B A; merging writes exactly that into the experts' weights.
  autograd::NoGradGuard no_grad;
  Tensor ids = Tensor::from_vector<int32_t>({2, 8}, {1, 5, 9, 2, 7, 3, 8, 4, 6, 2, 5, 1, 9, 3, 7, 2});
  const Tensor want = model->logits(ids);
  models::merge_adapters(*model);
  EXPECT_TRUE(models::adapters_of(*model).empty());
  test::expect_bitwise(model->logits(ids), want, "merged expert adapters' logits");
  // The adapters changed the function (the check above is not between two base models).
  const auto w = want.to_vector<float>(), base = cfg.model.build(3)->logits(ids).to_vector<float>();
  double most = 0;
  for (size_t i = 0; i < w.size(); ++i) most = std::max(most, static_cast<double>(std::fabs(w[i] - base[i])));
  EXPECT_GT(most, 1e-6);
}

namespace {
// A loom run of a tiny DeepSeek-V3 (dsv3-tiny's shape: 1 dense + 1 MoE layer of 4 routed experts, one MTP
// module) with the ChatML tiny Llama's tokenizer, template and end of text, to fine-tune.
std::string dsv3_run(const TempDir& dir) {
  runs::LoadedRun base = runs::load_weights(chatml_tiny());
  const runs::ChatSettings chat = runs::chat_settings(base, "");
  nlohmann::json m = train::TrainConfig::load("dsv3-tiny").model.json();
  m["vocab_size"] = static_cast<int64_t>(base.tokenizer->vocab_size());
  m["context_length"] = 128;
  auto model = models::ModelConfig::from_json(m).build(3);
  const std::string out = dir / "dsv3";
  fs::create_directories(out);
  runs::save_model_weights(*model, out + "/model.safetensors");
  tokenizer::save_hf_json(*base.tokenizer, out + "/tokenizer.json");
  models::write_tokenizer_config(out, *base.tokenizer, std::nullopt, chat.eos, chat.chat_template, 128);
  return out;
}
}  // namespace

TEST(Finetune, ATinyDeepSeekV3RunWithExpertAdaptersAndPackingResumesBitForBit) {
  TempDir dir;
  train::FinetuneConfig c = tiny_config(write_data(dir));
  c.weights = dsv3_run(dir);
  c.adapter.targets = {"wq_b", "wkv_b", "layers.1.moe.shared.w1", "experts"};
  c.adapter.lora.dropout = 0;  // refused on the experts
  c.packing = true;
  c.exact_match = 0;  // decoding recomputes the whole sequence per token for DeepSeek-V3: slow, and not the point
  expect_resumes_bit_for_bit(dir, c);
  // LoRA leaves the base frozen, the routing biases (model state) included.
  c.max_steps = 2;
  c.eval_interval = 0;
  c.checkpoint_interval = 0;
  train::Finetuner f(c, dir / "again");
  f.run();
  auto& ds = dynamic_cast<deepseek_v3::DeepSeekV3&>(f.model());
  for (deepseek_v3::MoE* moe : ds.moe_layers()) test::expect_bitwise(moe->bias, Tensor::zeros(moe->bias.shape()), "routing bias");
  bool experts = false;
  for (nn::LoRA* l : models::adapters_of(f.model())) experts |= l->experts == 4;
  EXPECT_TRUE(experts);
}
