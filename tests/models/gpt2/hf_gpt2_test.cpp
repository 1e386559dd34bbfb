// GPT-2 Hugging Face directories: fixtures written by transformers itself (make_hf_gpt2_fixture.py:
// GPT2LMHeadModel.save_pretrained with random weights in several shapes, float16, sharded, and OpenAI's
// released layout) import with transformers' logits and loss; import -> export -> import is bitwise;
// and what is not GPT-2 is refused naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "io/safetensors.h"
#include "models/gpt2/model.h"
#include "models/hf.h"
#include "support/files.h"
#include "support/hf_checks.h"
#include "support/op_test.h"
#include "tokenizer/formats.h"
#include "train/evaluate.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(LOOM_TEST_DIR) / "fixtures";

const nlohmann::json& reference() {
  static const nlohmann::json ref = test::read_json(kFixtures / "hf_gpt2_reference.json");
  return ref;
}

using test::expect_same_model;
using test::hf_import_error;
using test::TempDir;
constexpr auto gpt2_of = &test::model_as<gpt2::GPT2>;

class Gpt2HfFixture : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Gpt2HfFixture, ImportsWithTransformersLogitsAndLoss) {
  const std::string dir = GetParam();
  const nlohmann::json& ref = reference().at(dir);
  models::HfImport hf = models::import_hf((kFixtures / dir).string());
  ASSERT_EQ(hf.model->arch(), "gpt2");
  const int64_t T = ref["window"].get<int64_t>();
  std::vector<int32_t> ids;
  for (auto v : ref["ids_window0"]) ids.push_back(v.get<int32_t>());
  Tensor logits = hf.model->logits(Tensor::from_vector<int32_t>({1, T}, ids));
  const auto want = ref["logits_window0"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<size_t>(logits.numel()), want.size());
  double max_err = 0;
  for (size_t i = 0; i < want.size(); ++i) max_err = std::max(max_err, std::abs(logits.data<float>()[i] - want[i]));
  EXPECT_LT(max_err, 2e-5) << "largest logit difference against transformers' GPT2LMHeadModel";

  auto tokens = data::TokenFile::open((kFixtures / "hf_gpt2_data" / "val.bin").string());
  auto r = train::evaluate(*hf.model, tokens, T);
  EXPECT_EQ(r.windows, ref["windows"].get<int64_t>());
  EXPECT_NEAR(r.loss, ref["loss"].get<double>(), 1e-5);

  // import -> export -> import: the same parameters, bit for bit.
  TempDir tmp;
  models::export_hf(*hf.model, nullptr, (tmp.path / "again").string());
  models::HfImport again = models::import_hf((tmp.path / "again").string());
  expect_same_model(*hf.model, *again.model);
  EXPECT_EQ(gpt2_of(*again.model).config().to_json(), gpt2_of(*hf.model).config().to_json());
}

INSTANTIATE_TEST_SUITE_P(TransformersWrote, Gpt2HfFixture,
                         ::testing::Values("hf_gpt2_tiny", "hf_gpt2_untied", "hf_gpt2_fp16", "hf_gpt2_sharded",
                                           "hf_gpt2_openai"));

// A save_pretrained directory exported again holds the same tensors under the same names, bit for bit
// (the tied head stays absent; the untied one is written).
TEST(Gpt2Hf, ExportWritesTransformersOwnTensors) {
  for (const char* dir : {"hf_gpt2_tiny", "hf_gpt2_untied"}) {
    SCOPED_TRACE(dir);
    TempDir tmp;
    models::HfImport hf = models::import_hf((kFixtures / dir).string());
    models::export_hf(*hf.model, nullptr, (tmp.path / "out").string());
    auto original = io::load_safetensors((kFixtures / dir / "model.safetensors").string());
    auto exported = io::load_safetensors((tmp.path / "out" / "model.safetensors").string());
    EXPECT_EQ(original.size(), exported.size());
    for (const auto& [name, t] : original) {
      ASSERT_TRUE(exported.count(name)) << name;
      EXPECT_EQ(t.shape(), exported.at(name).shape()) << name;
      EXPECT_EQ(t.to_vector<float>(), exported.at(name).to_vector<float>()) << name;
    }
    std::ifstream in(tmp.path / "out" / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    EXPECT_EQ(config["model_type"], "gpt2");
    EXPECT_EQ(config["activation_function"], "gelu_new");
    EXPECT_EQ(config["tie_word_embeddings"], std::string(dir) == "hf_gpt2_tiny");
  }
}

TEST(Gpt2Hf, OpenAiLayoutIgnoresTheMaskBuffersAndTiesTheHead) {
  models::HfImport openai = models::import_hf((kFixtures / "hf_gpt2_openai").string());
  const gpt2::GPT2& g = gpt2_of(*openai.model);
  EXPECT_TRUE(g.config().tie_embeddings);
  EXPECT_TRUE(g.config().qkv_bias);
  EXPECT_EQ(g.lm_head, nullptr);
}

// A loom GPT-2 (no q/k/v bias, untied) with a tokenizer: export writes the tokenizer in both formats,
// the biases loom lacks as zeros, and importing gives the same logits.
TEST(Gpt2Hf, LoomModelRoundTripsWithItsTokenizer) {
  TempDir tmp;
  const gpt2::Config c{.vocab_size = 300, .context_length = 16, .d_model = 16, .num_layers = 2, .num_heads = 2,
                       .qkv_bias = false, .tie_embeddings = false};
  gpt2::GPT2 model(c, 5);
  tokenizer::Tokenizer tok = tokenizer::load_tokenizer(LOOM_SOURCE_DIR "/tests/tokenizer/hf_tokenizer.json");
  models::export_hf(model, &tok, (tmp.path / "hf").string());
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "vocab.json", "merges.txt"}) {
    EXPECT_TRUE(fs::exists(tmp.path / "hf" / f)) << f;
  }
  auto file = io::SafetensorsFile::open((tmp.path / "hf" / "model.safetensors").string());
  EXPECT_EQ(file.tensor("transformer.h.0.attn.c_attn.bias").to_vector<float>(), std::vector<float>(48, 0.0f));
  models::HfImport back = models::import_hf((tmp.path / "hf").string());
  ASSERT_TRUE(back.tokenizer.has_value());
  EXPECT_EQ(back.tokenizer->vocab_size(), tok.vocab_size());
  Tensor ids = Tensor::from_vector<int32_t>({1, 5}, {1, 50, 299, 7, 0});
  EXPECT_EQ(model.logits(ids).to_vector<float>(), back.model->logits(ids).to_vector<float>());
}

TEST(Gpt2Hf, MissingOrMisshapedTensorsAndUnsupportedOptionsAreRefused) {
  TempDir tmp;
  auto all = io::load_safetensors((kFixtures / "hf_gpt2_tiny" / "model.safetensors").string());
  auto write_variant = [&](const std::string& name, std::map<std::string, Tensor> tensors, const nlohmann::json& config_patch) {
    fs::path d = tmp.path / name;
    fs::create_directories(d);
    io::NamedTensors list(tensors.begin(), tensors.end());
    io::write_safetensors((d / "model.safetensors").string(), list);
    std::ifstream in(kFixtures / "hf_gpt2_tiny" / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    if (config_patch.is_object()) config.merge_patch(config_patch);  // {} is null: no patch
    std::ofstream(d / "config.json") << config.dump();
    return d;
  };
  auto missing = all;
  missing.erase("transformer.h.1.mlp.c_fc.bias");
  EXPECT_NE(hf_import_error(write_variant("missing", missing, {})).find("layers.1.mlp.fc.bias"), std::string::npos);
  auto misshaped = all;
  misshaped.at("transformer.h.0.mlp.c_proj.weight") = Tensor::zeros({3, 32});
  EXPECT_NE(hf_import_error(write_variant("misshaped", misshaped, {})).find("transformer.h.0.mlp.c_proj.weight"),
            std::string::npos);
  auto extra = all;
  extra.emplace("transformer.h.0.attn.rotary.weight", Tensor::zeros({2}));
  EXPECT_NE(hf_import_error(write_variant("extra", extra, {})).find("transformer.h.0.attn.rotary.weight"),
            std::string::npos);
  EXPECT_NE(hf_import_error(write_variant("relu", all, {{"activation_function", "relu"}})).find("activation_function \"relu\""),
            std::string::npos);
  EXPECT_NE(hf_import_error(write_variant("layer_idx", all, {{"scale_attn_by_inverse_layer_idx", true}}))
                .find("scale_attn_by_inverse_layer_idx"),
            std::string::npos);
  EXPECT_NE(hf_import_error(write_variant("untied_no_head", all, {{"tie_word_embeddings", false}})).find("no lm_head.weight"),
            std::string::npos);
  EXPECT_NE(hf_import_error(write_variant("heads", all, {{"n_head", 5}})).find("num_heads=5"), std::string::npos);
  EXPECT_NE(hf_import_error(write_variant("mamba", all, {{"model_type", "mamba"}})).find("model_type \"mamba\""),
            std::string::npos);
}
