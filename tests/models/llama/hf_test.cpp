// Hugging Face Llama export/import: the RoPE row permutation, a bitwise round trip, and an HF directory
// loom did not write (fixtures/hf_tiny, from make_hf_fixture.py) checked against an independent PyTorch
// implementation of HF's Llama forward (fixtures/hf_reference.json), in-process and through `loom eval`.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "ops/rope.h"
#include "support/files.h"
#include "support/hf_checks.h"
#include "support/op_test.h"
#include "train/evaluate.h"
#include "models/hf.h"
#include "models/llama/hf.h"
#include "tokenizer/train.h"
#include "runs/load.h"

using namespace loom;
using test::expect_bitwise;
namespace fs = std::filesystem;

namespace {

using test::TempDir;
// The Llama an import built (these fixtures are all Llamas).
constexpr auto llama_of = &test::model_as<llama::TransformerLM>;

const fs::path kFixtures = fs::path(LOOM_TEST_DIR) / "fixtures";

nlohmann::json reference() { return test::read_json(kFixtures / "hf_reference.json"); }

llama::Config small_config() {
  return {.vocab_size = 50, .context_length = 24, .d_model = 32, .num_layers = 2, .num_heads = 4, .d_ff = 48,
      .rope_theta = 1000.0f, .norm_eps = 1e-5f};
}

std::string run_command(const std::string& cmd) {
  std::FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd << "\n" << out;
  return out;
}

}  // namespace

TEST(Hf, PermutationMapsInterleavedRopeToRotateHalf) {
  // rope_rotate_half(P x) == P rope_interleaved(x) for the row permutation P export applies to q and k.
  const int64_t H = 3, D = 8, T = 5;
  Tensor x = Tensor::empty({H * D, T});  // columns are positions after the transpose below
  fill_normal(x.data<float>(), x.numel(), RngKey::from_seed(1), 0, 0, 1);
  // As [T, H*D] vectors: rows of `x` are features; permute features = permute rows of x.
  Tensor px = llama::interleaved_to_rotate_half(x, H);
  auto as_heads = [&](const Tensor& features_by_t) {  // [H*D, T] -> [H, T, D]
    Tensor out = Tensor::empty({H, T, D});
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          out.data<float>()[(h * T + t) * D + d] = features_by_t.data<float>()[(h * D + d) * T + t];
    return out;
  };
  Tensor pos = Tensor::from_vector<int32_t>({T}, {0, 1, 2, 3, 4});
  Tensor loom_rot = ops::rope(as_heads(x), pos, 500.0f, ops::RopeStyle::Interleaved);
  Tensor hf_rot = ops::rope(as_heads(px), pos, 500.0f, ops::RopeStyle::RotateHalf);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D / 2; ++i)
        for (int64_t half = 0; half < 2; ++half) {
          const float a = loom_rot.data<float>()[(h * T + t) * D + 2 * i + half];
          const float b = hf_rot.data<float>()[(h * T + t) * D + half * D / 2 + i];
          EXPECT_NEAR(a, b, 1e-6f) << "h=" << h << " t=" << t << " pair " << i;
        }
  // And it is a bijection: back again gives the same bits.
  expect_bitwise(llama::rotate_half_to_interleaved(px, H), x, "inverse permutation");
}

TEST(Hf, NamesMapBothWays) {
  llama::TransformerLM model(small_config(), 1);
  std::set<std::string> hf;
  for (nn::Parameter* p : model.parameters()) {
    const std::string h = llama::hf_parameter_name(p->name);
    EXPECT_EQ(llama::loom_parameter_name(h), std::optional<std::string>(p->name));
    hf.insert(h);
  }
  for (const char* n : {"model.embed_tokens.weight", "model.layers.1.self_attn.o_proj.weight",
                        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                        "model.layers.0.mlp.down_proj.weight", "model.layers.1.post_attention_layernorm.weight",
                        "model.norm.weight", "lm_head.weight"}) {
    EXPECT_TRUE(hf.count(n)) << n;
  }
  EXPECT_EQ(llama::hf_parameter_name("layers.0.ffn.w1.weight"), "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(llama::hf_parameter_name("layers.0.ffn.w3.weight"), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(llama::hf_parameter_name("layers.0.ffn.w2.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_FALSE(llama::loom_parameter_name("model.layers.0.self_attn.q_proj.bias"));
}

TEST(Hf, ExportThenImportIsBitwiseIdentical) {
  TempDir tmp;
  const llama::Config c = small_config();
  llama::TransformerLM model(c, 7);
  models::export_hf(model, nullptr, (tmp.path / "hf").string());
  for (const char* f : {"config.json", "model.safetensors", "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(tmp.path / "hf" / f)) << f;
  }
  std::ifstream in(tmp.path / "hf" / "config.json");
  auto cfg = nlohmann::json::parse(in);
  EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cfg["hidden_size"], 32);
  EXPECT_EQ(cfg["intermediate_size"], 48);
  EXPECT_EQ(cfg["num_key_value_heads"], 4);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["rope_theta"].get<double>(), 1000.0);
  EXPECT_EQ(cfg["rms_norm_eps"].get<double>(), 1e-5);

  // The exported q rows are loom's rows reordered per head: HF row h*D+i <- loom row h*D+2i.
  auto file = io::SafetensorsFile::open((tmp.path / "hf" / "model.safetensors").string());
  Tensor q_hf = file.tensor("model.layers.1.self_attn.q_proj.weight");
  const Tensor& q = model.parameter("layers.1.attn.q_proj.weight").value;
  const int64_t D = c.head_dim(), C = c.d_model;
  for (int64_t h = 0; h < c.num_heads; ++h) {
    EXPECT_EQ(q_hf.data<float>()[(h * D + 1) * C + 3], q.data<float>()[(h * D + 2) * C + 3]);
    EXPECT_EQ(q_hf.data<float>()[(h * D + D / 2) * C + 5], q.data<float>()[(h * D + 1) * C + 5]);
  }
  expect_bitwise(file.tensor("model.layers.0.mlp.gate_proj.weight"), model.parameter("layers.0.ffn.w1.weight").value,
                 "gate_proj = w1");

  models::HfImport back = models::import_hf((tmp.path / "hf").string());
  EXPECT_EQ(llama_of(*back.model).config().d_model, c.d_model);
  EXPECT_EQ(llama_of(*back.model).config().rope_theta, c.rope_theta);
  EXPECT_EQ(llama_of(*back.model).config().norm_eps, c.norm_eps);
  EXPECT_EQ(llama_of(*back.model).config().context_length, c.context_length);
  auto a = model.parameters(), b = back.model->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) expect_bitwise(a[i]->value, b[i]->value, a[i]->name);
  Tensor ids = Tensor::from_vector<int32_t>({2, 6}, {1, 5, 9, 49, 0, 3, 7, 7, 2, 11, 30, 4});
  expect_bitwise(model.forward(ids).detach(), back.model->logits(ids).detach(), "logits");
}

namespace {

// Imports fixtures/<dir> (written by make_hf_fixture.py, not by loom) and checks it against `ref`: window
// 0's logits against the independent PyTorch forward, the eval loss over hf_data/val.bin, and that
// exporting the import again gives back the fixture's tensors bit for bit. Returns the re-exported
// config.json.
nlohmann::json expect_matches_reference(const std::string& dir, const nlohmann::json& ref, models::HfImport& hf) {
  hf = models::import_hf((kFixtures / dir).string());
  const int64_t T = ref["window"].get<int64_t>();
  std::vector<int32_t> ids;
  for (auto v : ref["ids_window0"]) ids.push_back(v.get<int32_t>());
  Tensor logits = hf.model->logits(Tensor::from_vector<int32_t>({1, T}, ids)).detach();
  const auto want = ref["logits_window0"].get<std::vector<double>>();
  EXPECT_EQ(static_cast<size_t>(logits.numel()), want.size());
  double max_err = 0;
  for (size_t i = 0; i < want.size() && i < static_cast<size_t>(logits.numel()); ++i)
    max_err = std::max(max_err, std::abs(logits.data<float>()[i] - want[i]));
  EXPECT_LT(max_err, 2e-4) << "largest logit difference against the PyTorch HF forward";

  auto tokens = data::TokenFile::open((kFixtures / "hf_data" / "val.bin").string());
  auto r = train::evaluate(*hf.model, tokens, T);
  EXPECT_EQ(r.windows, ref["windows"].get<int64_t>());
  EXPECT_NEAR(r.loss, ref["loss"].get<double>(), 2e-5);

  TempDir tmp;
  models::export_hf(*hf.model, nullptr, (tmp.path / "again").string());
  auto original = io::load_safetensors((kFixtures / dir / "model.safetensors").string());
  auto again = io::load_safetensors((tmp.path / "again" / "model.safetensors").string());
  EXPECT_EQ(original.size(), again.size());
  for (const auto& [name, t] : original) {
    EXPECT_TRUE(again.count(name)) << name;
    if (again.count(name)) expect_bitwise(t, again.at(name), name);
  }
  std::ifstream config(tmp.path / "again" / "config.json");
  return nlohmann::json::parse(config);
}

}  // namespace

TEST(Hf, ForeignDirectoryMatchesAnIndependentPyTorchForward) {
  models::HfImport hf;
  expect_matches_reference("hf_tiny", reference(), hf);
  EXPECT_EQ(llama_of(*hf.model).config().rope_theta, 500.0f);
}

TEST(Hf, GroupedQueryDirectoryMatchesAnIndependentPyTorchForward) {
  // 4 query heads over 2 key/value heads, computed by make_hf_fixture.py as transformers' repeat_kv does.
  std::ifstream in(kFixtures / "hf_reference_gqa.json");
  models::HfImport hf;
  nlohmann::json exported = expect_matches_reference("hf_tiny_gqa", nlohmann::json::parse(in), hf);
  EXPECT_EQ(llama_of(*hf.model).config().kv_heads(), 2);
  EXPECT_EQ(hf.model->parameter("layers.0.attn.k_proj.weight").value.shape(), (Shape{16, 32}));
  EXPECT_EQ(exported["num_key_value_heads"].get<int64_t>(), 2);
}

TEST(Hf, LoomEvalOnTheHfDirectoryGivesThePyTorchLoss) {
  auto ref = reference();
  TempDir tmp;
  // Through --weights HFDIR, and through loom import + --run.
  const std::string data = (kFixtures / "hf_data" / "val.bin").string();
  const std::string T = std::to_string(ref["window"].get<int64_t>());
  auto direct = nlohmann::json::parse(run_command(std::string(LOOM_CLI) + " eval --weights " +
                                                  (kFixtures / "hf_tiny").string() + " --data " + data +
                                                  " --context-length " + T + " 2>&1"));
  EXPECT_NEAR(direct["loss"].get<double>(), ref["loss"].get<double>(), 2e-5);
  run_command(std::string(LOOM_CLI) + " import --hf " + (kFixtures / "hf_tiny").string() + " --out " +
              (tmp.path / "run").string() + " 2>&1");
  auto imported = nlohmann::json::parse(run_command(std::string(LOOM_CLI) + " eval --run " + (tmp.path / "run").string() +
                                                    " --data " + data + " --context-length " + T + " 2>&1"));
  EXPECT_EQ(imported["loss"].get<double>(), direct["loss"].get<double>());

  // And `loom export` of the imported run writes the fixture's tensors back, bit for bit.
  run_command(std::string(LOOM_CLI) + " export --run " + (tmp.path / "run").string() + " --format hf --out " +
              (tmp.path / "hf").string() + " 2>&1");
  auto original = io::load_safetensors((kFixtures / "hf_tiny" / "model.safetensors").string());
  auto exported = io::load_safetensors((tmp.path / "hf" / "model.safetensors").string());
  ASSERT_EQ(original.size(), exported.size());
  for (const auto& [name, t] : original) {
    ASSERT_TRUE(exported.count(name)) << name;
    expect_bitwise(t, exported.at(name), name);
  }
}

TEST(Hf, UnsupportedOptionsAreNamed) {
  TempDir tmp;
  auto variant = [&](const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    fs::path d = tmp.path / name;
    fs::create_directories(d);
    fs::copy_file(kFixtures / "hf_tiny" / "model.safetensors", d / "model.safetensors");
    std::ifstream in(kFixtures / "hf_tiny" / "config.json");
    auto c = nlohmann::json::parse(in);
    edit(c);
    std::ofstream(d / "config.json") << c.dump();
    return d.string();
  };
  auto message = [](const std::string& dir) -> std::string {
    try {
      models::import_hf(dir);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_THAT(message(variant("gqa", [](auto& c) { c["num_key_value_heads"] = 3; })),
              ::testing::HasSubstr("num_key_value_heads = 3 does not divide num_attention_heads = 4"));
  // 2 k/v heads are fine, but then the fixture's 4-head k_proj does not fit.
  EXPECT_THAT(message(variant("gqa_shape", [](auto& c) { c["num_key_value_heads"] = 2; })),
              ::testing::HasSubstr("k_proj.weight' has shape [32, 32] but config.json implies [16, 32]"));
  EXPECT_THAT(message(variant("bias", [](auto& c) { c["attention_bias"] = true; })),
              ::testing::HasSubstr("attention_bias"));
  EXPECT_THAT(message(variant("scaling", [](auto& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; })),
              ::testing::HasSubstr("rope_scaling"));
  EXPECT_THAT(message(variant("act", [](auto& c) { c["hidden_act"] = "gelu"; })), ::testing::HasSubstr("gelu"));
  EXPECT_THAT(message(variant("mistral", [](auto& c) { c["model_type"] = "mistral"; })), ::testing::HasSubstr("mistral"));
  EXPECT_THAT(message(variant("shape", [](auto& c) { c["intermediate_size"] = 96; })),
              ::testing::HasSubstr("has shape"));

  // Tied embeddings without an lm_head tensor: the head becomes a copy of the embedding.
  fs::path tied = tmp.path / "tied";
  fs::create_directories(tied);
  auto all = io::load_safetensors((kFixtures / "hf_tiny" / "model.safetensors").string());
  all.erase("lm_head.weight");
  io::write_safetensors((tied / "model.safetensors").string(), all);
  fs::copy_file(kFixtures / "hf_tiny" / "config.json", tied / "config.json");
  auto t = models::import_hf(tied.string());
  expect_bitwise(t.model->parameter("lm_head.weight").value, all.at("model.embed_tokens.weight"), "tied head");
  EXPECT_FALSE(t.notes.empty());
}

TEST(Hf, ExportWritesTheTokenizerFilesAndImportReadsThemBack) {
  TempDir tmp;
  tokenizer::TrainOptions o;
  o.vocab_size = 300;
  o.special_tokens = {"<|endoftext|>"};
  o.threads = 1;
  const std::string text =
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
      "of a wife. However little known the feelings or views of such a man may be on his first entering a "
      "neighbourhood, this truth is so well fixed in the minds of the surrounding families. naïve café";
  tokenizer::Tokenizer tok = tokenizer::train_bpe_on_text(text, o);
  llama::Config c = small_config();
  c.vocab_size = static_cast<int64_t>(tok.vocab_size());
  llama::TransformerLM model(c, 3);
  models::export_hf(model, &tok, (tmp.path / "hf").string());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(tmp.path / "hf" / f)) << f;
  }
  std::ifstream tj_in(tmp.path / "hf" / "tokenizer.json");
  auto tj = nlohmann::json::parse(tj_in);
  ASSERT_FALSE(tj["model"]["merges"].empty());
  EXPECT_TRUE(tj["model"]["merges"][0].is_string()) << "merges as \"a b\" strings, readable by every tokenizers version";
  std::ifstream cfg_in(tmp.path / "hf" / "config.json");
  auto cfg = nlohmann::json::parse(cfg_in);
  EXPECT_EQ(cfg["eos_token_id"].get<int64_t>(), static_cast<int64_t>(*tok.special_token_id("<|endoftext|>")));

  models::HfImport back = models::import_hf((tmp.path / "hf").string());
  ASSERT_TRUE(back.tokenizer.has_value());
  const std::string probe = "a single man, naïve <|endoftext|> café";
  EXPECT_EQ(back.tokenizer->encode(probe), tok.encode(probe));
  EXPECT_EQ(back.tokenizer->vocab_size(), tok.vocab_size());

  // `loom generate --weights HFDIR` runs on the directory, with its tokenizer.
  std::string out = run_command(std::string(LOOM_CLI) + " generate --weights " + (tmp.path / "hf").string() +
                                " --prompt 'a single man' --max-new-tokens 8 --temperature 0");
  EXPECT_EQ(out.rfind("a single man", 0), 0u) << out;
  EXPECT_GT(out.size(), std::string("a single man\n").size()) << out;
}

TEST(Hf, ImportsBf16AndShardedDirectories) {
  TempDir tmp;
  auto all = io::load_safetensors((kFixtures / "hf_tiny" / "model.safetensors").string());
  models::HfImport ref = models::import_hf((kFixtures / "hf_tiny").string());

  // BF16 weights are widened to F32: the result equals the F32 fixture rounded to BF16 and back.
  fs::create_directories(tmp.path / "bf16");
  std::map<std::string, Tensor> bf16, rounded;
  for (const auto& [name, t] : all) {
    bf16[name] = t.to(DType::BF16);
    rounded[name] = bf16[name].to(DType::F32);
  }
  io::write_safetensors((tmp.path / "bf16" / "model.safetensors").string(), bf16);
  fs::copy_file(kFixtures / "hf_tiny" / "config.json", tmp.path / "bf16" / "config.json");
  models::HfImport b = models::import_hf((tmp.path / "bf16").string());
  fs::create_directories(tmp.path / "rounded");
  io::write_safetensors((tmp.path / "rounded" / "model.safetensors").string(), rounded);
  fs::copy_file(kFixtures / "hf_tiny" / "config.json", tmp.path / "rounded" / "config.json");
  models::HfImport r = models::import_hf((tmp.path / "rounded").string());
  for (nn::Parameter* p : b.model->parameters()) {
    expect_bitwise(p->value, r.model->parameter(p->name).value, "bf16 " + p->name);
  }

  // Shards named by model.safetensors.index.json.
  fs::create_directories(tmp.path / "sharded");
  std::map<std::string, Tensor> first, second;
  nlohmann::json index = {{"metadata", nlohmann::json::object()}, {"weight_map", nlohmann::json::object()}};
  for (const auto& [name, t] : all) {
    const bool in_first = name.find("layers.1.") == std::string::npos;
    (in_first ? first : second)[name] = t;
    index["weight_map"][name] = in_first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  io::write_safetensors((tmp.path / "sharded" / "model-00001-of-00002.safetensors").string(), first);
  io::write_safetensors((tmp.path / "sharded" / "model-00002-of-00002.safetensors").string(), second);
  std::ofstream(tmp.path / "sharded" / "model.safetensors.index.json") << index.dump();
  fs::copy_file(kFixtures / "hf_tiny" / "config.json", tmp.path / "sharded" / "config.json");
  models::HfImport s = models::import_hf((tmp.path / "sharded").string());
  for (nn::Parameter* p : ref.model->parameters()) {
    expect_bitwise(p->value, s.model->parameter(p->name).value, "sharded " + p->name);
  }
}

// transformers 5 writes RoPE's θ under rope_parameters.rope_theta (no top-level rope_theta): read it, and
// refuse what changes the model but loom does not do (a scaled RoPE), never falling back to 10000.
TEST(HfImport, ReadsTransformers5RopeParameters) {
  TempDir tmp;
  std::ifstream in(kFixtures / "hf_tiny" / "config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  ASSERT_TRUE(config.contains("rope_theta"));
  const float theta = config["rope_theta"].get<float>();
  ASSERT_NE(theta, 10000.0f);
  auto variant = [&](const std::string& name, const nlohmann::json& c) {
    fs::path d = tmp.path / name;
    fs::create_directories(d);
    fs::copy_file(kFixtures / "hf_tiny" / "model.safetensors", d / "model.safetensors");
    std::ofstream(d / "config.json") << c.dump();
    return d.string();
  };
  nlohmann::json v5 = config;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};
  models::HfImport a = models::import_hf(variant("v5", v5));
  EXPECT_EQ(llama_of(*a.model).config().rope_theta, theta);
  models::HfImport ref = models::import_hf((kFixtures / "hf_tiny").string());
  Tensor ids = Tensor::from_vector<int32_t>({1, 4}, {1, 2, 3, 4});
  expect_bitwise(a.model->logits(ids), ref.model->logits(ids), "logits");

  nlohmann::json scaled = v5;
  scaled["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", theta}, {"factor", 2.0}};
  test::expect_error_mentions([&] { models::import_hf(variant("scaled", scaled)); }, {"rope_parameters.", "not supported"});
  nlohmann::json both = v5;
  both["rope_theta"] = theta * 2;
  test::expect_error_mentions([&] { models::import_hf(variant("both", both)); }, {"disagrees"});
}
