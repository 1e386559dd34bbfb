// The tables of tensor names (models/tensor_names.h) and the config field lists (models/config_fields.h)
// on their own: the expansion order, both directions of a name, that every family's table names every
// tensor its model has, and what a partial or wrong `model` section gets. Each family's folder under
// tests/models checks the conversions themselves against transformers' and gguf's files.
#include <set>

#include "models/config_fields.h"
#include "models/deepseek_v3/names.h"
#include "models/gpt2/names.h"
#include "models/llama/config.h"
#include "models/llama/names.h"
#include "models/model_config.h"
#include "models/tensor_names.h"
#include "support/op_test.h"

using namespace loom;
using models::Change;
using models::TensorFormat;

namespace {

// Every kind of row: a fused tensor, expert slices, layers after the last block ({k+num_layers}).
const models::TensorTable& toy() {
  static const models::TensorTable t{
      .family = "Toy",
      .counts = {{"i", "num_layers"}, {"k", "n_extra"}, {"e", "n_experts"}},
      .rows = {
          {"embed.weight", "embed", "tok"},
          {"layers.{i}.q.weight", "h.{i}.qkv", "blk.{i}.qkv", {.part = {0, 3}}},
          {"layers.{i}.k.weight", "h.{i}.qkv", "blk.{i}.qkv", {.part = {1, 3}}},
          {"layers.{i}.v.weight", "h.{i}.qkv", "blk.{i}.qkv", {.part = {2, 3}}},
          {"layers.{i}.experts", "h.{i}.expert.{e}", "", {.hf = Change::Slice}},
          {"extra.{k}.norm", "h.{k+num_layers}.norm", ""},
          {"head.weight", "head", "out"},
      }};
  return t;
}

const nlohmann::json kToyModel = {{"num_layers", 2}, {"n_extra", 1}, {"n_experts", 2}};

std::vector<std::string> names_of(TensorFormat format) {
  std::vector<std::string> out;
  for (const models::StoredTensor& t : models::stored_tensors(toy(), format, kToyModel)) out.push_back(t.name);
  return out;
}

}  // namespace

TEST(TensorNames, ExpandBlockByBlockInTableOrder) {
  EXPECT_EQ(names_of(TensorFormat::Hf), (std::vector<std::string>{"embed", "h.0.qkv", "h.0.expert.0", "h.0.expert.1",
                                                                  "h.1.qkv", "h.1.expert.0", "h.1.expert.1", "h.2.norm",
                                                                  "head"}));
  EXPECT_EQ(names_of(TensorFormat::Gguf), (std::vector<std::string>{"tok", "blk.0.qkv", "blk.1.qkv", "out"}));
  const auto hf = models::stored_tensors(toy(), TensorFormat::Hf, kToyModel);
  EXPECT_EQ(hf[4].loom, (std::vector<std::string>{"layers.1.q.weight", "layers.1.k.weight", "layers.1.v.weight"}));
  EXPECT_EQ(hf[6].loom, std::vector<std::string>{"layers.1.experts"});
  EXPECT_EQ(hf[6].index, 1);
  EXPECT_EQ(hf[6].change, Change::Slice);
}

TEST(TensorNames, NamesMapBothWays) {
  EXPECT_EQ(models::stored_name(toy(), TensorFormat::Hf, "extra.0.norm", &kToyModel), "h.2.norm");
  EXPECT_EQ(models::loom_name(toy(), TensorFormat::Hf, "h.2.norm", &kToyModel), "extra.0.norm");
  EXPECT_EQ(models::loom_name(toy(), TensorFormat::Hf, "h.1.norm", &kToyModel), std::nullopt);  // k would be -1
  EXPECT_EQ(models::stored_name(toy(), TensorFormat::Gguf, "layers.12.k.weight"), "blk.12.qkv");
  EXPECT_EQ(models::loom_name(toy(), TensorFormat::Gguf, "blk.12.qkv"), "layers.12.q.weight");  // a fused one's first
  EXPECT_EQ(models::loom_name(toy(), TensorFormat::Gguf, "h.1.qkv"), std::nullopt);
  EXPECT_EQ(models::loom_name(toy(), TensorFormat::Hf, "h.x.qkv"), std::nullopt);
  test::expect_error_mentions([] { models::stored_name(toy(), TensorFormat::Gguf, "layers.0.experts"); },
                              {"no GGUF name", "Toy", "'layers.0.experts'"});
}

// Export fails on a parameter no row names, so exporting a small model of each family proves its table
// complete; the stored names are distinct, and loom's names map both ways (but for GPT-2's fused q, k, v,
// and DeepSeek-V3's, whose MTP layers reuse the block names after the last layer: its import maps the
// stored names of the model it builds instead).
TEST(TensorNames, EveryFamilyNamesEveryTensorOfItsModel) {
  const nlohmann::json small = {{"vocab_size", 64}, {"context_length", 16}, {"d_model", 16}, {"num_layers", 2},
                                {"num_heads", 2}};
  struct Case {
    nlohmann::json model;
    const models::TensorTable& table;
    bool gguf;  // the family has GGUF names
  };
  nlohmann::json dsv3 = small;
  dsv3.update({{"arch", "deepseek_v3"}, {"n_dense", 1}, {"q_rank", 8}, {"kv_rank", 8}, {"d_nope", 4}, {"d_rope", 4},
               {"d_v", 4}, {"d_ff", 16}, {"n_routed", 4}, {"top_k", 2}, {"d_expert", 8}, {"n_mtp", 1}});
  nlohmann::json llama = small, gpt2 = small;
  llama.update({{"arch", "llama"}, {"d_ff", 32}});
  gpt2.update({{"arch", "gpt2"}, {"qkv_bias", false}, {"tie_embeddings", false}});
  for (const Case& f : {Case{llama, llama::tensor_names(), true}, Case{gpt2, gpt2::tensor_names(), true},
                        Case{dsv3, deepseek_v3::tensor_names(), false}}) {
    SCOPED_TRACE(f.model.dump());
    auto model = models::ModelConfig::from_json(f.model).build(0);
    const nlohmann::json& config = model->model_config().json();
    for (TensorFormat format : {TensorFormat::Hf, TensorFormat::Gguf}) {
      if (format == TensorFormat::Gguf && !f.gguf) continue;
      std::set<std::string> names;
      for (const auto& [name, value] : models::export_tensors(f.table, format, *model)) {
        EXPECT_TRUE(names.insert(name).second) << name << " twice";
      }
      for (nn::Parameter* p : model->parameters()) {
        if (p->name.find(".experts.") != std::string::npos) continue;  // slices: one stored name per expert
        const std::string stored = models::stored_name(f.table, format, p->name, &config);
        EXPECT_TRUE(names.count(stored)) << p->name << " -> " << stored;
        const bool fused = f.table.family == "GPT-2" && (p->name.find(".q_proj.") != std::string::npos ||
                                                         p->name.find(".k_proj.") != std::string::npos ||
                                                         p->name.find(".v_proj.") != std::string::npos);
        if (fused || f.table.family == "DeepSeek-V3") continue;
        EXPECT_EQ(models::loom_name(f.table, format, stored, &config), p->name) << stored;
      }
    }
  }
}

TEST(ConfigFields, PartialSectionsTakeTheDefaultsAndWrongOnesAreNamed) {
  const llama::Config c = llama::Config::from_json({{"d_model", 64}, {"num_heads", 4}});
  EXPECT_EQ(c.d_model, 64);
  EXPECT_EQ(c.vocab_size, llama::Config{}.vocab_size);
  EXPECT_EQ(c.num_kv_heads, 0);  // absent in sections saved before grouped-query attention
  EXPECT_EQ(llama::Config::from_json(c.to_json()).to_json(), c.to_json());
  EXPECT_EQ(c.to_json().at("norm_eps"), 1e-5);  // the float's shortest decimal
  test::expect_error_mentions([] { llama::Config::from_json({{"d_modle", 64}}); },
                              {"unknown key model.d_modle", "d_model"});
  test::expect_error_mentions([] { llama::Config::from_json({{"d_model", "64"}}); },
                              {"model.d_model must be an integer", "\"64\""});
  test::expect_error_mentions([] { llama::Config::from_json({{"arch", "gpt2"}}); }, {"model.arch is \"gpt2\"", "llama"});
  test::expect_error_mentions([] { llama::Config::from_json({{"rope_theta", -2.0}}); },
                              {"model.rope_theta must be positive, got -2"});
  test::expect_error_mentions([] { llama::Config::from_json({{"num_kv_heads", -1}}); },
                              {"model.num_kv_heads must be >= 0 (0 means the same as num_heads), got -1"});
}
