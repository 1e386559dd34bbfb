// GGUF import and export of loom's Llama and of tokenizers, against fixtures tests/gguf/make_fixtures.py
// wrote to fixtures/ here: a tiny Llama GGUF written by the `gguf` package with q/k permuted as llama.cpp's
// converter does, transformers' logits for it, and tokenizers' ids for its vocabulary (which lacks three
// bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/tensor.h"
#include "gguf/gguf.h"
#include "gguf/tokenizer.h"
#include "models/gguf.h"
#include "models/llama/gguf.h"
#include "quant/qmatmul.h"
#include "support/cli.h"
#include "support/files.h"
#include "support/gguf_files.h"
#include "support/model_fixture.h"
#include "support/op_test.h"
#include "tokenizer/formats.h"
#include "runs/load.h"

namespace fs = std::filesystem;
using namespace loom;
using loom::quant::QuantType;
using namespace loom::test;

namespace {

const fs::path kFixtures = fs::path(LOOM_TEST_DIR) / "fixtures";
const std::string kTiny = (kFixtures / "tiny_llama.gguf").string();

Tensor ids_tensor(const std::vector<int32_t>& ids) {
  return Tensor::from_vector(Shape({1, static_cast<int64_t>(ids.size())}), ids);
}

std::vector<tokenizer::TokenId> as_ids(const nlohmann::json& j) { return j.get<std::vector<tokenizer::TokenId>>(); }

void set_key(std::vector<gguf::KeyValue>& kv, const std::string& key, gguf::Value v) {
  for (auto& e : kv) {
    if (e.key == key) {
      e.value = std::move(v);
      return;
    }
  }
  kv.push_back({key, std::move(v)});
}

}  // namespace

TEST(LlamaGguf, ImportGivesTransformersLogitsWithoutPermutingQk) {
  const nlohmann::json want = read_json(kFixtures / "tiny_llama.json");
  models::GgufImport g = models::import_gguf(kTiny);
  const auto& cfg = g.model->model_config().json();
  EXPECT_EQ(cfg["num_layers"], 2);
  EXPECT_EQ(cfg["num_heads"], 4);
  EXPECT_EQ(cfg["num_kv_heads"], 2);  // GQA
  EXPECT_EQ(cfg["d_ff"], 96);
  EXPECT_EQ(cfg["context_length"], 128);
  EXPECT_EQ(cfg["vocab_size"], want["vocab_size"]);
  ASSERT_FALSE(g.notes.empty());
  EXPECT_NE(g.notes[0].find("tied"), std::string::npos);
  const std::vector<int32_t> ids = want["ids"].get<std::vector<int32_t>>();
  Tensor logits = g.model->logits(ids_tensor(ids));
  const int64_t V = logits.shape()[2];
  double worst = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    for (int64_t v = 0; v < V; ++v) {
      worst = std::max(worst, std::abs(double(logits.data<float>()[t * V + v]) - want["logits"][t][v].get<double>()));
    }
  }
  // transformers ran on the same dequantized weights, un-permuted to HF's rotate-half order; loom takes the
  // GGUF rows as they are. A wrong RoPE pairing would differ by O(1).
  EXPECT_LT(worst, 1e-4);
}

TEST(LlamaGguf, TokenizerFromMetadataEncodesAsTransformersDoes) {
  const nlohmann::json want = read_json(kFixtures / "tiny_llama.json");
  models::GgufImport g = models::import_gguf(kTiny);
  ASSERT_TRUE(g.tokenizer.has_value());
  EXPECT_EQ(g.bos, 1u);
  EXPECT_EQ(g.eos, 2u);
  EXPECT_EQ(g.tokenizer->unknown_token(), 0u);
  EXPECT_EQ(g.tokenizer->missing_bytes(), (std::vector<uint8_t>{0x04, 0x05, 0x7f}));
  EXPECT_NE(g.chat_template.find("<|im_start|>"), std::string::npos);
  for (const auto& c : want["tokenizer"]) {
    SCOPED_TRACE(c["text"].get<std::string>());
    EXPECT_EQ(g.tokenizer->encode(c["text"].get<std::string>()), as_ids(c["ids"]));  // control tokens included
  }
}

TEST(LlamaGguf, TokenizerJsonWithoutSomeBytesEncodesAsTokenizersDoes) {
  const nlohmann::json want = read_json(kFixtures / "tiny_llama.json");
  for (const char* variant : {"unk_fused", "unk_unfused", "no_unk"}) {
    SCOPED_TRACE(variant);
    tokenizer::Tokenizer tok = tokenizer::load_tokenizer((kFixtures / (std::string("tokenizer_") + variant + ".json")).string());
    for (size_t i = 0; i < want["tokenizer"].size(); ++i) {
      const std::string text = want["tokenizer"][i]["text"];
      EXPECT_EQ(tok.encode(text), as_ids(want["tokenizer_json"][variant][i])) << text;
    }
    // What loom writes reads back the same (unk_token and fuse_unk included).
    tokenizer::Tokenizer again = tokenizer::tokenizer_from_hf_json(tokenizer::to_hf_json(tok));
    EXPECT_EQ(again.unknown_token(), tok.unknown_token());
    EXPECT_EQ(again.fuse_unknown(), tok.fuse_unknown());
    // A piece longer than 128 bytes takes BPE's heap path: the same rules there. One piece of 402 bytes
    // (the regex keeps punctuation and control bytes together): without an unknown token the two bytes
    // vanish and the '!'s around them merge as if they were adjacent.
    const std::string run = std::string(200, '!') + "\x04\x04" + std::string(200, '!');
    const auto ids = tok.encode(run);
    if (!tok.unknown_token()) {
      EXPECT_EQ(ids, tok.encode(std::string(400, '!')));
    } else {
      EXPECT_EQ(std::count(ids.begin(), ids.end(), *tok.unknown_token()), tok.fuse_unknown() ? 1 : 2);
    }
  }
}

TEST(LlamaGguf, F32ExportRoundTripsBitForBit) {
  TempDir dir;
  models::GgufImport g = models::import_gguf(kTiny);
  models::GgufExportOptions o;
  o.type = QuantType::F32;
  o.bos = g.bos;
  o.eos = g.eos;
  o.chat_template = g.chat_template;
  models::export_gguf(*g.model, &*g.tokenizer, dir / "out.gguf", o);
  gguf::GgufFile f = gguf::GgufFile::open(dir / "out.gguf");
  EXPECT_EQ(f.header().find_tensor("output.weight"), nullptr);  // tied head left out
  EXPECT_EQ(f.header().get_string("general.architecture"), "llama");
  models::GgufImport back = models::import_gguf(dir / "out.gguf");
  for (nn::Parameter* p : g.model->parameters()) {
    const Tensor& a = p->value;
    const Tensor& b = back.model->parameter(p->name).value;
    ASSERT_EQ(a.shape(), b.shape()) << p->name;
    EXPECT_EQ(std::memcmp(a.data<float>(), b.data<float>(), a.nbytes()), 0) << p->name;
  }
  EXPECT_EQ(back.model->model_config().json(), g.model->model_config().json());
  EXPECT_EQ(back.tokenizer->vocab(), g.tokenizer->vocab());
  EXPECT_EQ(back.tokenizer->merges(), g.tokenizer->merges());
  EXPECT_EQ(back.tokenizer->special_tokens(), g.tokenizer->special_tokens());
  EXPECT_EQ(back.tokenizer->unknown_token(), g.tokenizer->unknown_token());
  EXPECT_EQ(back.bos, g.bos);
  EXPECT_EQ(back.eos, g.eos);
  EXPECT_EQ(back.chat_template, g.chat_template);
}

TEST(LlamaGguf, QuantizedExportStoresWhatQuantizeGives) {
  TempDir dir;
  models::GgufImport g = models::import_gguf(kTiny);
  // An untied head, so output.weight is written too.
  Tensor head = g.model->parameter("lm_head.weight").value.clone();
  head.data<float>()[0] += 1.0f;
  g.model->load_parameter("lm_head.weight", head);
  for (QuantType type : {QuantType::F16, QuantType::Q8_0, QuantType::Q4_1}) {
    SCOPED_TRACE(quant::quant_type_name(type));
    models::GgufExportOptions o;
    o.type = type;
    models::export_gguf(*g.model, nullptr, dir / "q.gguf", o);
    gguf::GgufFile f = gguf::GgufFile::open(dir / "q.gguf");
    EXPECT_FALSE(gguf::has_tokenizer(f.header()));
    // llama.cpp's llama_ftype, not the ggml type id (Q8_0 is ftype 7 but type 8).
    EXPECT_EQ(f.header().get_uint("general.file_type"), type == QuantType::F16 ? 1u : type == QuantType::Q8_0 ? 7u : 3u);
    ASSERT_NE(f.header().find_tensor("output.weight"), nullptr);
    for (nn::Parameter* p : g.model->parameters()) {
      const std::string name = llama::gguf_tensor_name(p->name);
      const gguf::TensorInfo& t = f.info(name);
      const bool matrix = p->value.shape().ndim() == 2;
      EXPECT_EQ(t.type, matrix ? type : QuantType::F32) << name;
      // Stored blocks are quant::quantize's, row by row.
      const int64_t row = p->value.shape()[p->value.shape().ndim() - 1];
      std::vector<uint8_t> want(static_cast<size_t>(quant::row_bytes(t.type, row)));
      const auto stored = f.bytes(name);
      for (int64_t r = 0; r < p->value.numel() / row; ++r) {
        quant::quantize(t.type, p->value.data<float>() + r * row, row, want.data());
        ASSERT_EQ(std::memcmp(want.data(), stored.data() + r * want.size(), want.size()), 0) << name << " row " << r;
      }
    }
  }
}

TEST(LlamaGguf, RefusesWhatLoomCannotRunNamingIt) {
  TempDir dir;
  auto import_error = [&](const std::string& name, auto edit) {
    return error_of([&] { models::import_gguf(test::rewrite_gguf(kTiny, dir / name, edit)); });
  };
  using KV = std::vector<gguf::KeyValue>;
  using TS = std::vector<gguf::TensorEntry>;
  EXPECT_NE(import_error("a.gguf", [](KV& kv, TS&) { set_key(kv, "general.architecture", gguf::Value{std::string("qwen2")}); })
                .find("general.architecture 'qwen2' is not supported (loom reads: llama, gpt2)"),
            std::string::npos);
  EXPECT_NE(import_error("b.gguf", [](KV& kv, TS&) {
              set_key(kv, "llama.rope.scaling.type", gguf::Value{std::string("linear")});
            }).find("llama.rope.scaling.type = 'linear' is not supported"),
            std::string::npos);
  EXPECT_NE(import_error("c.gguf", [](KV& kv, TS&) { set_key(kv, "llama.expert_count", gguf::Value{uint32_t{8}}); })
                .find("llama.expert_count = 8 (mixture of experts)"),
            std::string::npos);
  EXPECT_NE(import_error("d.gguf", [](KV& kv, TS&) { set_key(kv, "llama.rope.dimension_count", gguf::Value{uint32_t{8}}); })
                .find("partial rotary"),
            std::string::npos);
  EXPECT_NE(import_error("e.gguf", [](KV& kv, TS&) { set_key(kv, "tokenizer.ggml.model", gguf::Value{std::string("llama")}); })
                .find("tokenizer.ggml.model is 'llama'"),
            std::string::npos);
  EXPECT_NE(import_error("f.gguf", [](KV& kv, TS&) { set_key(kv, "tokenizer.ggml.pre", gguf::Value{std::string("qwen2")}); })
                .find("tokenizer.ggml.pre is 'qwen2', a pre-tokenizer loom does not have"),
            std::string::npos);
  EXPECT_NE(import_error("g.gguf", [](KV& kv, TS&) { set_key(kv, "llama.attention.head_count_kv", gguf::Value{uint32_t{3}}); })
                .find("head_count_kv = 3 does not divide"),
            std::string::npos);
  EXPECT_NE(import_error("h.gguf", [](KV&, TS& ts) { ts[0].name = "token_embd.weight.extra"; })
                .find("tensor 'token_embd.weight.extra' (Q8_0) is not part of loom's Llama"),
            std::string::npos);
  EXPECT_NE(import_error("i.gguf", [](KV&, TS& ts) { ts.pop_back(); }).find("no tensor 'output_norm.weight'"),
            std::string::npos);
  EXPECT_NE(import_error("j.gguf", [](KV& kv, TS&) { set_key(kv, "llama.feed_forward_length", gguf::Value{uint32_t{64}}); })
                .find("has shape"),
            std::string::npos);
  EXPECT_NE(import_error("k.gguf", [](KV& kv, TS&) { set_key(kv, "llama.block_count", gguf::Value{std::string("2")}); })
                .find("'llama.block_count' is string '2', expected a non-negative integer"),
            std::string::npos);
}

TEST(LlamaGguf, CliImportGenerateAndExport) {
  TempDir dir;
  auto r = test::run_cli("import --gguf " + kTiny + " --out " + dir / "run");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "run/tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir / "run/tokenizer_config.json"));
  // The tokenizer.json loom wrote encodes as the metadata's tokenizer does.
  const nlohmann::json want = read_json(kFixtures / "tiny_llama.json");
  tokenizer::Tokenizer tok = tokenizer::load_tokenizer(dir / "run/tokenizer.json");
  for (const auto& c : want["tokenizer"]) EXPECT_EQ(tok.encode(c["text"].get<std::string>()), as_ids(c["ids"]));

  // generate from the GGUF (dequantized) and from the imported run: the same greedy text.
  const std::string args = " --prompt 'the thing' --temperature 0 --max-new-tokens 8";
  auto a = test::run_cli("generate --weights " + kTiny + args + " --f32", false);
  auto b = test::run_cli("generate --run " + dir / "run" + args, false);
  ASSERT_EQ(a.status, 0) << a.output;
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_EQ(a.output.rfind("the thing", 0), 0u);

  auto e = test::run_cli("export --run " + dir / "run" + " --format gguf --gguf-type q8_0 --out " + dir / "x.gguf");
  ASSERT_EQ(e.status, 0) << e.output;
  models::GgufImport back = models::import_gguf(dir / "x.gguf");
  EXPECT_EQ(back.eos, 2u);  // from tokenizer_config.json
  EXPECT_NE(back.chat_template.find("<|im_start|>"), std::string::npos);
  auto again = test::run_cli("export --run " + dir / "run" + " --format gguf --out " + dir / "x.gguf");
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.output.find("exists (give --overwrite to replace it)"), std::string::npos) << again.output;
  auto bad = test::run_cli("export --run " + dir / "run" + " --format gguf --gguf-type q5_k --out " + dir / "y.gguf");
  EXPECT_NE(bad.output.find("GGUF export type \"q5_k\" is not supported"), std::string::npos) << bad.output;
  auto missing = test::run_cli("import --out " + dir / "z");
  EXPECT_NE(missing.output.find("give --hf DIR or --gguf FILE"), std::string::npos) << missing.output;
}

TEST(LlamaGguf, TrainContinuesFromGgufWeightsWithTheirTokenizer) {
  TempDir dir;
  // lr 0: one step changes nothing, so the run's weights must be the GGUF's, bit for bit.
  const std::string data = " --set data.corpus=" + (fs::path(LOOM_SOURCE_DIR) / "tests/gguf/make_fixtures.py").string() +
                           " --set data.tokenizer=" + dir / "d/tokenizer.json" + " --set data.train=" +
                           dir / "d/train.bin" + " --set data.val=" + dir / "d/val.bin";
  auto r = test::run_cli("train --config tiny --weights " + kTiny + data +
                         " --set training.max_steps=1 --set optimizer.lr=0 --set optimizer.min_lr=0 --set "
                         "model.context_length=32 --set training.batch_size=2 --set sample.num_samples=0 --set "
                         "logging.progress=none --out " + dir / "run");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("starting from the weights of"), std::string::npos) << r.output;
  models::GgufImport g = models::import_gguf(kTiny);
  auto run = runs::load_run(dir / "run");
  EXPECT_EQ(run.model->model_config().json()["context_length"], 32);
  for (nn::Parameter* p : g.model->parameters()) {
    const Tensor& a = p->value;
    const Tensor& b = run.model->parameter(p->name).value;
    // Equal values (an update of lr 0 may turn a Q4_0 weight's -0.0 into +0.0).
    int64_t differ = 0;
    for (int64_t i = 0; i < a.numel(); ++i) differ += a.data<float>()[i] != b.data<float>()[i];
    EXPECT_EQ(differ, 0) << p->name;
  }
  // The run's tokenizer is the GGUF's, and its eos and chat template are kept for a GGUF export.
  ASSERT_TRUE(run.tokenizer.has_value());
  EXPECT_EQ(run.tokenizer->vocab(), g.tokenizer->vocab());
  EXPECT_TRUE(fs::exists(dir / "run/tokenizer_config.json"));
  auto bad = test::run_cli("train --config tiny --weights " + kTiny + data + " --set model.num_layers=3 --out " +
                           dir / "run2");
  EXPECT_NE(bad.output.find("--set model.num_layers would change the model the weights describe"), std::string::npos)
      << bad.output;
}

TEST(LlamaGguf, QuantizedInferenceRunsOnTheFileBlocksWithinActivationRounding) {
  models::GgufImport f = models::import_gguf(kTiny, /*quantized=*/false);
  models::GgufImport q = models::import_gguf(kTiny, /*quantized=*/true);
  ASSERT_EQ(q.notes.size(), 3u);
  // The 2x7 projections and the head, less the two F16 ffn_up (no kernels): 13 of 15.
  EXPECT_NE(q.notes[1].find("13 of 15 matrices kept quantized"), std::string::npos) << q.notes[1];
  autograd::NoGradGuard no_grad;  // inference only
  const nlohmann::json want = read_json(kFixtures / "tiny_llama.json");
  const std::vector<int32_t> ids = want["ids"].get<std::vector<int32_t>>();
  Tensor lf = f.model->logits(ids_tensor(ids));
  Tensor lq = q.model->logits(ids_tensor(ids));
  // The quantized layers do not read their f32 weights: poisoning them changes nothing.
  Tensor nan = Tensor::full(q.model->parameter("layers.0.attn.q_proj.weight").value.shape(), NAN);
  q.model->load_parameter("layers.0.attn.q_proj.weight", nan);
  q.model->load_parameter("lm_head.weight", Tensor::full(q.model->parameter("lm_head.weight").value.shape(), NAN));
  Tensor lq2 = q.model->logits(ids_tensor(ids));
  EXPECT_EQ(std::memcmp(lq.data<float>(), lq2.data<float>(), lq.nbytes()), 0);
  // Against the f32 path: activations rounded to 8 bits per block of 32 move the logits by a small
  // fraction of their scale, and no further.
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < lf.numel(); ++i) {
    ASSERT_TRUE(std::isfinite(lq.data<float>()[i]));
    worst = std::max(worst, double(std::abs(lf.data<float>()[i] - lq.data<float>()[i])));
    scale = std::max(scale, double(std::abs(lf.data<float>()[i])));
  }
  EXPECT_GT(worst, 0.0);          // it is another computation
  EXPECT_LT(worst, 0.05 * scale);  // of the same numbers (measured: 2.2% of the scale; a wrong kernel is off by ~100%)
}

TEST(LlamaGguf, AQuantizedOnlyImportHoldsOneCopyOfTheBlocksAndNoF32Weights) {
  // QLoRA's import (GgufMatrices::QuantizedOnly): the held matrices' f32 parameters are never filled and
  // are released, so the allocator holds less than the AlsoQuantized import by exactly their f32 bytes
  // (each left a [0] tensor: one 64-byte block), and the blocks are held once: read in place from the
  // file's mapping, with no interleaved copy.
  Allocator& cpu = allocator_for(Device::cpu());
  const int64_t start = cpu.stats().bytes_in_use;
  models::GgufImport also = models::import_gguf(kTiny, /*quantized=*/true);
  const int64_t also_bytes = cpu.stats().bytes_in_use - start;
  models::GgufImport only = models::import_gguf(kTiny, /*quantized=*/true, /*quantized_only=*/true);
  const int64_t only_bytes = cpu.stats().bytes_in_use - start - also_bytes;
  auto& m = dynamic_cast<llama::TransformerLM&>(*only.model);
  int64_t held = 0, held_f32 = 0;
  for (nn::Linear* l : test::llama_linears(m)) {
    if (!l->quantized) {
      EXPECT_GT(l->weight.value.numel(), 0) << l->name();
      continue;
    }
    ++held;
    held_f32 += l->quantized->rows() * l->quantized->cols() * 4;
    EXPECT_EQ(l->weight.value.numel(), 0) << l->name() << " holds f32 weights";
    EXPECT_EQ(l->quantized->packed(), nullptr) << l->name() << " holds a second (interleaved) copy";
  }
  EXPECT_EQ(held, 13);
  // The token embedding, stored in a type with kernels, is held as blocks too (looked up row by row).
  const gguf::GgufFile file = gguf::GgufFile::open(kTiny);
  const bool table_held = quant::has_matmul_kernels(file.info("token_embd.weight").type);
  ASSERT_EQ(m.token_embeddings.quantized != nullptr, table_held);
  if (table_held) {
    EXPECT_EQ(m.token_embeddings.weight.value.numel(), 0);
    held_f32 += m.token_embeddings.quantized->rows() * m.token_embeddings.quantized->cols() * 4;
    ++held;
  }
  EXPECT_GE(also_bytes - only_bytes, held_f32 - 64 * held);
  EXPECT_LE(also_bytes - only_bytes, held_f32);
  EXPECT_NE(only.notes[0].find("13 of 15 matrices kept quantized only, never in f32"), std::string::npos)
      << only.notes[0];
  // The blocks are the right ones (the tied head's included): multiplied by their dequantized tiles, the
  // logits are the f32 import's.
  autograd::NoGradGuard no_grad;
  models::GgufImport f = models::import_gguf(kTiny);
  for (nn::Linear* l : test::llama_linears(m)) l->dequantized_matmul = l->quantized != nullptr;
  const std::vector<int32_t> ids = read_json(kFixtures / "tiny_llama.json")["ids"].get<std::vector<int32_t>>();
  test::expect_close(only.model->logits(ids_tensor(ids)), f.model->logits(ids_tensor(ids)), 1e-5f, 1e-4f, "logits");
  // And the integer kernels, reading the rows as stored, agree with the interleaved copy's path up to
  // the activations' 8-bit rounding (measured: 0.1% of the logits' scale; a wrong kernel is off by ~100%).
  for (nn::Linear* l : test::llama_linears(m)) l->dequantized_matmul = false;
  Tensor a = only.model->logits(ids_tensor(ids)), b = also.model->logits(ids_tensor(ids));
  double worst = 0, scale = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    worst = std::max(worst, double(std::abs(a.data<float>()[i] - b.data<float>()[i])));
    scale = std::max(scale, double(std::abs(b.data<float>()[i])));
  }
  EXPECT_LT(worst, 0.01 * scale);
}
