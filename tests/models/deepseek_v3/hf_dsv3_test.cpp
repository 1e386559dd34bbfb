// DeepSeek-V3 Hugging Face directories: fixtures written by transformers itself (make_hf_dsv3_fixture.py:
// DeepseekV3ForCausalLM.save_pretrained with random weights and routing biases, RoPE interleaved and not)
// import with transformers' logits and loss; loom -> HF -> loom is bitwise, the routing biases and the MTP
// module included; and HF options loom cannot compute are refused naming the key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/deepseek_v3/hf.h"
#include "models/deepseek_v3/model.h"
#include "models/hf.h"
#include "support/files.h"
#include "support/hf_checks.h"

using namespace loom;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(LOOM_TEST_DIR) / "fixtures";

const nlohmann::json& reference() {
  static const nlohmann::json ref = test::read_json(kFixtures / "hf_dsv3_reference.json");
  return ref;
}

using test::expect_same_model;
using test::hf_import_error;
using test::TempDir;
constexpr auto dsv3_of = &test::model_as<deepseek_v3::DeepSeekV3>;

void copy_dir(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
}

// Rewrites DIR/model.safetensors with `edit` applied to (copies of) its tensors.
using Weights = std::map<std::string, Tensor>;
void edit_weights(const fs::path& dir, const std::function<void(Weights&)>& edit) {
  Weights tensors;
  for (auto& [name, t] : io::load_safetensors((dir / "model.safetensors").string())) tensors.emplace(name, t.clone());
  edit(tensors);
  io::write_safetensors((dir / "model.safetensors").string(), io::NamedTensors(tensors.begin(), tensors.end()),
                        {{"format", "pt"}});
}

// A dsv3-tiny-like model with every parameter and routing bias drawn at random (seeded).
std::unique_ptr<deepseek_v3::DeepSeekV3> random_model() {
  const deepseek_v3::Config c{.vocab_size = 64, .context_length = 16, .d_model = 16, .num_layers = 3, .n_dense = 1,
                              .num_heads = 2, .q_rank = 8, .kv_rank = 6, .d_nope = 4, .d_rope = 4, .d_v = 6, .d_ff = 24,
                              .n_shared = 1, .n_routed = 5, .top_k = 2, .d_expert = 8, .route_scale = 1.5f,
                              .gamma = 0.002f, .alpha_seq = 0.01f, .n_mtp = 2, .mtp_lambda = 0.25f,
                              .rope_theta = 777.0f, .norm_eps = 1e-5f};
  auto m = std::make_unique<deepseek_v3::DeepSeekV3>(c, 7);
  uint32_t s = 12345;
  auto next = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
  };
  for (nn::Parameter* p : m->parameters()) {
    std::vector<float> v(static_cast<size_t>(p->value.numel()));
    for (float& x : v) x = next();
    m->load_parameter(p->name, Tensor::from_vector<float>(p->value.shape(), v));
  }
  for (const auto& [name, t] : m->state_tensors()) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (float& x : v) x = 0.1f * next();
    m->load_state(name, Tensor::from_vector<float>(t.shape(), v));
  }
  return m;
}

class Dsv3HfFixture : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Dsv3HfFixture, ImportsWithTransformersLogitsAndLoss) {
  const std::string dir = GetParam();
  const nlohmann::json& ref = reference().at(dir);
  models::HfImport hf = models::import_hf((kFixtures / dir).string());
  ASSERT_EQ(hf.model->arch(), "deepseek_v3");
  const deepseek_v3::Config& c = dsv3_of(*hf.model).config();
  EXPECT_EQ(c.n_mtp, 0) << "transformers writes no MTP layer";
  EXPECT_EQ(c.route_scale, 2.5f);
  EXPECT_EQ(c.n_routed, 6);
  EXPECT_EQ(c.d_v, 6);
  // The fixture's routing biases are not zero: they reach loom's state.
  bool nonzero_bias = false;
  for (const auto& [name, t] : hf.model->state_tensors()) {
    for (float b : t.to_vector<float>()) nonzero_bias = nonzero_bias || b != 0.0f;
  }
  EXPECT_TRUE(nonzero_bias);

  std::vector<int32_t> ids;
  for (auto v : ref["ids"]) ids.push_back(v.get<int32_t>());
  const int64_t T = static_cast<int64_t>(ids.size());
  Tensor logits = hf.model->logits(Tensor::from_vector<int32_t>({1, T}, ids));
  const auto want = ref["logits"].get<std::vector<double>>();
  ASSERT_EQ(static_cast<size_t>(logits.numel()), want.size());
  double max_err = 0;
  for (size_t i = 0; i < want.size(); ++i) max_err = std::max(max_err, std::abs(logits.data<float>()[i] - want[i]));
  EXPECT_LT(max_err, 1e-5) << "largest logit difference against transformers' DeepseekV3ForCausalLM";

  std::vector<int32_t> in(ids.begin(), ids.end() - 1), target(ids.begin() + 1, ids.end());
  const float loss = hf.model
                         ->loss(Tensor::from_vector<int32_t>({1, T - 1}, in), Tensor::from_vector<int32_t>({1, T - 1}, target))
                         .item();
  EXPECT_NEAR(loss, ref["loss"].get<double>(), 1e-5);

  // import -> export -> import: the same parameters and routing biases, bit for bit.
  TempDir tmp;
  models::export_hf(*hf.model, nullptr, (tmp.path / "again").string());
  models::HfImport again = models::import_hf((tmp.path / "again").string());
  expect_same_model(*hf.model, *again.model);
}

INSTANTIATE_TEST_SUITE_P(TransformersWrote, Dsv3HfFixture, ::testing::Values("hf_dsv3_tiny", "hf_dsv3_rotate_half"));

// loom -> HF -> loom with MTP modules and non-zero routing biases: the same model, bit for bit, the same
// config (training settings HF has no key for ride in config.json's "loom" object), the same logits.
TEST(Dsv3Hf, RoundTripIsBitwiseWithBiasesAndMtp) {
  auto m = random_model();
  TempDir tmp;
  models::export_hf(*m, nullptr, (tmp.path / "hf").string());
  models::HfImport back = models::import_hf((tmp.path / "hf").string());
  expect_same_model(*m, *back.model);
  EXPECT_EQ(dsv3_of(*back.model).config().to_json(), m->config().to_json());
  // norm_eps 1e-5: transformers would use 1e-6 in q_a_layernorm / kv_a_layernorm, and the import says so.
  bool eps_note = false;
  for (const std::string& n : back.notes) eps_note = eps_note || n.find("rms_norm_eps = 1e-05") != std::string::npos;
  EXPECT_TRUE(eps_note);
  Tensor ids = Tensor::from_vector<int32_t>({1, 6}, {3, 1, 4, 1, 5, 9});
  EXPECT_EQ(m->logits(ids).to_vector<float>(), back.model->logits(ids).to_vector<float>());

  // The MTP modules are layers num_hidden_layers + k, as DeepSeek's checkpoints carry them.
  auto tensors = io::load_safetensors((tmp.path / "hf" / "model.safetensors").string());
  for (const char* name : {"model.layers.3.enorm.weight", "model.layers.3.hnorm.weight", "model.layers.3.eh_proj.weight",
                           "model.layers.3.shared_head.norm.weight", "model.layers.3.shared_head.head.weight",
                           "model.layers.4.self_attn.kv_a_proj_with_mqa.weight", "model.layers.4.mlp.gate_proj.weight",
                           "model.layers.2.mlp.gate.e_score_correction_bias", "model.layers.2.mlp.experts.4.down_proj.weight"}) {
    EXPECT_TRUE(tensors.count(name)) << name;
  }
  EXPECT_FALSE(tensors.count("model.layers.5.enorm.weight"));
  // eh_proj takes [enorm(e) ; hnorm(h)]; loom's proj [norm_h(h) ; norm_e(e)].
  const Tensor& eh = tensors.at("model.layers.3.eh_proj.weight");
  const Tensor& proj = m->parameter("mtp.0.proj.weight").value;
  EXPECT_EQ(eh.data<float>()[0], proj.data<float>()[16]);
  EXPECT_EQ(eh.data<float>()[16], proj.data<float>()[0]);
  // The rope rows of kv_a_proj_with_mqa (its last 4) are interleaved: HF row 2i+half <- loom row i + half*2.
  const Tensor& kva = tensors.at("model.layers.0.self_attn.kv_a_proj_with_mqa.weight");
  const Tensor& wkv_a = m->parameter("layers.0.attn.wkv_a.weight").value;
  const int64_t C = 16, R = 6;
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t half = 0; half < 2; ++half) {
      EXPECT_EQ(kva.data<float>()[(R + 2 * i + half) * C], wkv_a.data<float>()[(R + half * 2 + i) * C]);
    }
  }
  std::ifstream in(tmp.path / "hf" / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  EXPECT_EQ(config["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(config["num_nextn_predict_layers"], 2);
  EXPECT_EQ(config["rope_interleave"], true);
  EXPECT_EQ(config["scoring_func"], "sigmoid");
}

// A checkpoint whose MTP copies of the head differ from the main head computes something loom's shared
// head cannot: refused naming the tensor.
TEST(Dsv3Hf, RefusesMtpHeadThatIsNotShared) {
  auto m = random_model();
  TempDir tmp;
  const fs::path dir = tmp.path / "hf";
  models::export_hf(*m, nullptr, dir.string());
  edit_weights(dir, [](Weights& w) { w.at("model.layers.3.shared_head.head.weight").data<float>()[0] += 1; });
  const std::string err = hf_import_error(dir);
  EXPECT_NE(err.find("model.layers.3.shared_head.head.weight"), std::string::npos) << err;
}

// DeepSeek's own V3 checkpoint has an MoE block in its MTP layer: the layer is left out with a note, the
// main model imports unchanged.
TEST(Dsv3Hf, LeavesOutAnMtpLayerWithAnMoeBlock) {
  auto m = random_model();
  TempDir tmp;
  const fs::path dir = tmp.path / "hf";
  models::export_hf(*m, nullptr, dir.string());
  edit_weights(dir, [](Weights& w) { w["model.layers.3.mlp.gate.weight"] = w.at("model.layers.2.mlp.gate.weight"); });
  models::HfImport hf = models::import_hf(dir.string());
  EXPECT_EQ(dsv3_of(*hf.model).config().n_mtp, 0);
  bool note = false;
  for (const std::string& n : hf.notes) note = note || n.find("MoE blocks") != std::string::npos;
  EXPECT_TRUE(note);
  for (nn::Parameter* p : hf.model->parameters()) {
    EXPECT_EQ(p->value.to_vector<float>(), m->parameter(p->name).value.to_vector<float>()) << p->name;
  }
}

TEST(Dsv3Hf, RefusesWhatLoomCannotComputeNamingTheKey) {
  TempDir tmp;
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"n_group", 2, "topk_group = 1"},
      {"scoring_func", "softmax", "scoring_func \"softmax\""},
      {"topk_method", "greedy", "topk_method \"greedy\""},
      {"norm_topk_prob", false, "norm_topk_prob = false"},
      {"rope_scaling", {{"type", "yarn"}, {"factor", 40}}, "rope_scaling"},
      {"q_lora_rank", nullptr, "q_lora_rank = null"},
      {"hidden_act", "gelu", "hidden_act \"gelu\""},
      {"attention_bias", true, "attention_bias = true"},
      {"num_experts_per_tok", 7, "model.top_k=7"},
      {"norm_topk_prob", "yes", "malformed DeepSeek-V3 config"},
      {"rope_interleave", 1, "rope_interleave must be true or false, got 1"},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    const fs::path dir = tmp.path / ("case" + std::to_string(i++));
    copy_dir(kFixtures / "hf_dsv3_tiny", dir);
    nlohmann::json config;
    {
      std::ifstream in(dir / "config.json");
      config = nlohmann::json::parse(in);
    }
    config[c.key] = c.value;
    if (std::string(c.key) == "n_group") config["topk_group"] = 1;
    std::ofstream(dir / "config.json") << config.dump();
    const std::string err = hf_import_error(dir);
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
  }
}
