// GGUF export and import of loom's GPT-2 in llama.cpp's "gpt2" layout (models/gpt2/gguf.h): names,
// shapes and metadata as llama.cpp's gguf package lists them for MODEL_ARCH.GPT2, values equal to loom's
// parameters (q, k, v stacked in that order into attn_qkv), the f32 round trip, and the refusals.
// tools/llamacpp_check.py checks the same files against llama.cpp itself (docs/gguf.md).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "core/tensor.h"
#include "gguf/gguf.h"
#include "models/gguf.h"
#include "models/gpt2/gguf.h"
#include "models/gpt2/model.h"
#include "support/files.h"
#include "support/op_test.h"

namespace fs = std::filesystem;
using namespace loom;
using loom::quant::QuantType;
using namespace loom::test;

namespace {

gpt2::Config small_config(bool tied, bool biases) {
  return {.vocab_size = 67, .context_length = 24, .d_model = 64, .num_layers = 2, .num_heads = 4, .d_ff = 96,
      .norm_eps = 1e-4f, .qkv_bias = biases, .output_proj_bias = biases, .tie_embeddings = tied};
}

// A GPT-2 whose every parameter is distinct random values (so a swapped q/k/v or bias shows).
std::unique_ptr<gpt2::GPT2> random_model(const gpt2::Config& c) {
  auto m = std::make_unique<gpt2::GPT2>(c, 1);
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 0.3f);
  for (nn::Parameter* p : m->parameters()) {
    Tensor v = Tensor::empty(p->value.shape(), DType::F32);
    for (int64_t i = 0; i < v.numel(); ++i) v.data<float>()[i] = n(rng);
    m->load_parameter(p->name, v);
  }
  return m;
}

bool same_bytes(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The expected GGUF tensors (llama.cpp's names) and loom shapes (ne reversed) for a config.
std::map<std::string, Shape> expected_tensors(const gpt2::Config& c) {
  const int64_t C = c.d_model, F = c.ffn_dim();
  std::map<std::string, Shape> m = {{"token_embd.weight", {c.vocab_size, C}}, {"position_embd.weight", {c.context_length, C}},
                                    {"output_norm.weight", {C}},              {"output_norm.bias", {C}}};
  if (!c.tie_embeddings) m["output.weight"] = Shape({c.vocab_size, C});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string b = str("blk.", i, ".");
    m[b + "attn_norm.weight"] = m[b + "attn_norm.bias"] = m[b + "ffn_norm.weight"] = m[b + "ffn_norm.bias"] = Shape({C});
    m[b + "attn_qkv.weight"] = Shape({3 * C, C});
    m[b + "attn_qkv.bias"] = Shape({3 * C});
    m[b + "attn_output.weight"] = Shape({C, C});
    m[b + "attn_output.bias"] = Shape({C});
    m[b + "ffn_up.weight"] = Shape({F, C});
    m[b + "ffn_up.bias"] = Shape({F});
    m[b + "ffn_down.weight"] = Shape({C, F});
    m[b + "ffn_down.bias"] = Shape({C});
  }
  return m;
}

// The model's tensors written as F32 with `kv` edits, to make malformed files for the refusals.
void write_edited(const gpt2::GPT2& model, const std::string& path,
                  const std::function<void(std::vector<gguf::KeyValue>&, std::vector<models::GgufTensorOut>&)>& edit) {
  std::vector<gguf::KeyValue> kv = {{"general.architecture", gguf::Value{std::string("gpt2")}}};
  std::vector<models::GgufTensorOut> tensors;
  gpt2::export_gguf(model, kv, tensors);
  edit(kv, tensors);
  std::vector<gguf::TensorEntry> entries;
  for (const auto& t : tensors) {
    std::vector<uint64_t> ne;
    for (int d = t.value.shape().ndim() - 1; d >= 0; --d) ne.push_back(static_cast<uint64_t>(t.value.shape()[d]));
    entries.push_back({t.name, ne, QuantType::F32, reinterpret_cast<const uint8_t*>(t.value.data<float>()),
                       static_cast<size_t>(t.value.nbytes())});
  }
  gguf::write_gguf_file(path, kv, entries);
}

}  // namespace

TEST(Gpt2Gguf, ExportWritesLlamaCppNamesShapesMetadataAndValues) {
  for (bool tied : {true, false}) {
    for (bool biases : {true, false}) {
      SCOPED_TRACE(str("tied=", tied, " biases=", biases));
      TempDir dir;
      const gpt2::Config c = small_config(tied, biases);
      auto model = random_model(c);
      models::GgufExportOptions o;
      o.type = QuantType::F32;
      models::export_gguf(*model, nullptr, dir / "m.gguf", o);
      gguf::GgufFile f = gguf::GgufFile::open(dir / "m.gguf");
      const gguf::Header& h = f.header();
      EXPECT_EQ(h.get_string("general.architecture"), "gpt2");
      EXPECT_EQ(h.get_uint("gpt2.block_count"), 2u);
      EXPECT_EQ(h.get_uint("gpt2.context_length"), 24u);
      EXPECT_EQ(h.get_uint("gpt2.embedding_length"), 64u);
      EXPECT_EQ(h.get_uint("gpt2.feed_forward_length"), 96u);
      EXPECT_EQ(h.get_uint("gpt2.attention.head_count"), 4u);
      EXPECT_EQ(static_cast<float>(h.get_number("gpt2.attention.layer_norm_epsilon")), 1e-4f);
      const auto want = expected_tensors(c);
      ASSERT_EQ(h.tensors.size(), want.size());
      for (const auto& [name, shape] : want) {
        ASSERT_NE(h.find_tensor(name), nullptr) << name;
        EXPECT_EQ(f.shape(name), shape) << name;
        EXPECT_EQ(f.info(name).type, QuantType::F32) << name;
      }
      // Values: each GGUF tensor is loom's parameter, attn_qkv is q, then k, then v (zeros for absent biases).
      auto check = [&](const std::string& g, const std::string& l) {
        const Tensor& v = model->parameter(l).value;
        EXPECT_TRUE(same_bytes(f.dequantized(g).data<float>(), v.data<float>(), v.numel())) << g;
      };
      check("token_embd.weight", "token_embeddings.weight");
      check("position_embd.weight", "position_embeddings.weight");
      check("output_norm.bias", "ln_final.bias");
      if (!tied) check("output.weight", "lm_head.weight");
      const int64_t C = c.d_model;
      for (int64_t i = 0; i < c.num_layers; ++i) {
        const std::string b = str("blk.", i, "."), l = str("layers.", i, ".");
        check(b + "attn_norm.bias", l + "ln1.bias");
        check(b + "ffn_norm.weight", l + "ln2.weight");
        check(b + "attn_output.weight", l + "attn.output_proj.weight");
        check(b + "ffn_up.weight", l + "mlp.fc.weight");
        check(b + "ffn_up.bias", l + "mlp.fc.bias");
        check(b + "ffn_down.weight", l + "mlp.proj.weight");
        check(b + "ffn_down.bias", l + "mlp.proj.bias");
        const Tensor qkv = f.dequantized(b + "attn_qkv.weight"), qkv_b = f.dequantized(b + "attn_qkv.bias");
        const char* parts[] = {"q_proj", "k_proj", "v_proj"};
        for (int j = 0; j < 3; ++j) {
          const Tensor& w = model->parameter(l + "attn." + parts[j] + ".weight").value;
          EXPECT_TRUE(same_bytes(qkv.data<float>() + j * C * C, w.data<float>(), C * C)) << b << parts[j];
          if (biases) {
            const Tensor& bv = model->parameter(l + "attn." + parts[j] + ".bias").value;
            EXPECT_TRUE(same_bytes(qkv_b.data<float>() + j * C, bv.data<float>(), C)) << b << parts[j];
          }
        }
        if (!biases) {
          for (const char* g : {"attn_qkv.bias", "attn_output.bias"}) {
            const Tensor z = f.dequantized(b + g);
            for (int64_t k = 0; k < z.numel(); ++k) ASSERT_EQ(z.data<float>()[k], 0.0f) << b << g;
          }
        }
      }
    }
  }
}

TEST(Gpt2Gguf, F32RoundTripIsBitwiseAndComputesTheSameLogits) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(str("tied=", tied));
    TempDir dir;
    auto model = random_model(small_config(tied, true));
    models::GgufExportOptions o;
    o.type = QuantType::F32;
    models::export_gguf(*model, nullptr, dir / "m.gguf", o);
    models::GgufImport back = models::import_gguf(dir / "m.gguf");
    EXPECT_EQ(back.model->model_config().json(), model->model_config().json());
    for (nn::Parameter* p : model->parameters()) {
      const Tensor& b = back.model->parameter(p->name).value;
      ASSERT_EQ(b.shape(), p->value.shape()) << p->name;
      EXPECT_TRUE(same_bytes(b.data<float>(), p->value.data<float>(), b.numel())) << p->name;
    }
    Tensor ids = Tensor::empty({1, 5}, DType::I32);
    for (int i = 0; i < 5; ++i) ids.data<int32_t>()[i] = 3 + 11 * i;
    const Tensor a = model->logits(ids), b = back.model->logits(ids);
    EXPECT_TRUE(same_bytes(a.data<float>(), b.data<float>(), a.numel()));
  }
}

TEST(Gpt2Gguf, QuantizedExportKeepsNormsAndBiasesF32) {
  TempDir dir;
  auto model = random_model(small_config(false, true));
  for (QuantType type : {QuantType::F16, QuantType::Q8_0, QuantType::Q4_1}) {
    SCOPED_TRACE(quant::quant_type_name(type));
    models::GgufExportOptions o;
    o.type = type;
    models::export_gguf(*model, nullptr, dir / "q.gguf", o);
    gguf::GgufFile f = gguf::GgufFile::open(dir / "q.gguf");
    for (const gguf::TensorInfo& t : f.header().tensors) {
      EXPECT_EQ(t.type, t.ne.size() == 2 ? type : QuantType::F32) << t.name;
    }
    // And it reads back (dequantized) into a model of the same config.
    EXPECT_EQ(models::import_gguf(dir / "q.gguf").model->model_config().json(), model->model_config().json());
  }
}

TEST(Gpt2Gguf, ImportRefusesWhatLoomsGpt2CannotHold) {
  TempDir dir;
  auto model = random_model(small_config(true, true));
  const std::string path = dir / "bad.gguf";
  auto expect_refused = [&](const std::string& needle) {
    const std::string e = error_of([&] { models::import_gguf(path); });
    EXPECT_NE(e.find(needle), std::string::npos) << e;
  };
  write_edited(*model, path, [](auto& kv, auto&) { kv.push_back({"gpt2.attention.head_count_kv", gguf::Value{uint32_t{2}}}); });
  expect_refused("gpt2.attention.head_count_kv = 2");
  write_edited(*model, path, [](auto&, auto& t) { std::erase_if(t, [](auto& e) { return e.name == "blk.1.attn_qkv.bias"; }); });
  expect_refused("no tensor 'blk.1.attn_qkv.bias'");
  write_edited(*model, path, [](auto&, auto& t) { t.push_back({"blk.0.attn_q.weight", Tensor::zeros({64, 64}), true}); });
  expect_refused("'blk.0.attn_q.weight' (F32) is not part of loom's GPT-2");
  write_edited(*model, path, [](auto&, auto& t) {
    for (auto& e : t) {
      if (e.name == "blk.0.attn_qkv.weight") e.value = Tensor::zeros({3 * 64 - 1, 64});
    }
  });
  expect_refused("'blk.0.attn_qkv.weight' has shape");
  write_edited(*model, path, [](auto& kv, auto&) {
    for (auto& e : kv) {
      if (e.key == "gpt2.attention.layer_norm_epsilon") e.value = gguf::Value{-1.0f};
    }
  });
  expect_refused("gpt2.attention.layer_norm_epsilon is -1");
}
