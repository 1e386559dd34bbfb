#include "train/hf.h"

#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "io/file.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "tokenizer/formats.h"

namespace loom::train {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Row permutation within each head of a [H*D, C] matrix: out row (h*D + to(j)) = in row (h*D + j).
Tensor permute_head_rows(const Tensor& w, int64_t num_heads, bool to_rotate_half) {
  LOOM_CHECK(w.dtype() == DType::F32 && w.shape().ndim() == 2, "RoPE row permutation: expected an f32 [H*D, C] matrix, got ",
             dtype_name(w.dtype()), " ", w.shape());
  const int64_t rows = w.shape()[0], C = w.shape()[1];
  LOOM_CHECK(num_heads > 0 && rows % num_heads == 0 && (rows / num_heads) % 2 == 0, "RoPE row permutation: ", rows,
             " rows do not split into ", num_heads, " heads of even size");
  const int64_t D = rows / num_heads;
  Tensor out = Tensor::empty(w.shape(), DType::F32);
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t i = 0; i < D / 2; ++i) {
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t interleaved = h * D + 2 * i + half;      // loom: pair i is rows (2i, 2i+1)
        const int64_t rotate_half = h * D + half * (D / 2) + i;  // HF: pair i is rows (i, i + D/2)
        const int64_t from = to_rotate_half ? interleaved : rotate_half;
        const int64_t to = to_rotate_half ? rotate_half : interleaved;
        std::memcpy(dst + to * C, src + from * C, static_cast<size_t>(C) * sizeof(float));
      }
    }
  }
  return out;
}

// The shortest decimal that reads back as the same float, as a JSON number (1e-05, not 9.99999974e-06).
json float_json(float f) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, f);
  return json::parse(std::string(buf, r.ptr));
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// One tensor of an HF file as f32.
Tensor read_as_f32(const io::SafetensorsFile& file, const std::string& name) {
  const auto& info = file.info(name);
  if (info.dtype == io::SafetensorsDtype::F32) return file.tensor(name).clone();
  if (info.dtype == io::SafetensorsDtype::BF16) return file.tensor(name).to(DType::F32);
  if (info.dtype == io::SafetensorsDtype::F16) {
    std::vector<int64_t> dims(info.shape.begin(), info.shape.end());
    Tensor out = Tensor::empty(Shape(dims), DType::F32);
    auto bytes = file.bytes(name);
    float* dst = out.data<float>();
    for (int64_t i = 0; i < out.numel(); ++i) {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      dst[i] = half_to_float(h);
    }
    return out;
  }
  LOOM_FAIL(file.path(), ": tensor '", name, "' has dtype ", io::safetensors_dtype_name(info.dtype),
            "; import reads F32, BF16 or F16 weights");
}

json read_json_file(const fs::path& path) {
  json j = io::try_parse_json(tokenizer::read_file(path.string()));
  LOOM_CHECK(!j.is_discarded() && j.is_object(), path.string(), " is not a JSON object");
  return j;
}

void write_json_file(const fs::path& path, const json& j) {
  const std::string text = j.dump(2) + "\n";
  io::write_file_atomically(path.string(), [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
}

llama::Config config_from_hf(const json& c, const std::string& path) {
  auto unsupported = [&](const std::string& what) {
    LOOM_FAIL(path, ": ", what, " is not supported by loom's Llama (", "supported: model_type llama, hidden_act silu, "
              "no biases, no rope_scaling, num_key_value_heads == num_attention_heads)");
  };
  const std::string model_type = c.value("model_type", "");
  if (model_type != "llama") unsupported(str("model_type \"", model_type, "\""));
  const std::string act = c.value("hidden_act", "silu");
  if (act != "silu" && act != "swish") unsupported(str("hidden_act \"", act, "\""));
  if (c.value("attention_bias", false)) unsupported("attention_bias = true");
  if (c.value("mlp_bias", false)) unsupported("mlp_bias = true");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null()) unsupported(str("rope_scaling ", io::brief_json(c["rope_scaling"])));
  try {
    llama::Config m;
    m.vocab_size = c.at("vocab_size").get<int64_t>();
    m.d_model = c.at("hidden_size").get<int64_t>();
    m.d_ff = c.at("intermediate_size").get<int64_t>();
    m.num_layers = c.at("num_hidden_layers").get<int64_t>();
    m.num_heads = c.at("num_attention_heads").get<int64_t>();
    m.context_length = c.value("max_position_embeddings", int64_t{2048});
    m.rope_theta = c.value("rope_theta", 10000.0f);
    m.norm_eps = c.value("rms_norm_eps", 1e-6f);
    const int64_t kv = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                           ? c["num_key_value_heads"].get<int64_t>()
                           : m.num_heads;
    LOOM_CHECK(kv > 0 && m.num_heads % kv == 0, path, ": num_key_value_heads = ", kv,
               " does not divide num_attention_heads = ", m.num_heads);
    m.num_kv_heads = kv == m.num_heads ? 0 : kv;
    if (c.contains("head_dim") && !c["head_dim"].is_null() && c["head_dim"].get<int64_t>() * m.num_heads != m.d_model) {
      unsupported(str("head_dim = ", c["head_dim"].get<int64_t>(), " with hidden_size ", m.d_model, " and ", m.num_heads,
                      " heads"));
    }
    m.validate();
    return m;
  } catch (const json::exception& e) {
    LOOM_FAIL(path, ": malformed Llama config: ", e.what());
  }
}

}  // namespace

Tensor interleaved_to_rotate_half(const Tensor& w, int64_t num_heads) { return permute_head_rows(w, num_heads, true); }
Tensor rotate_half_to_interleaved(const Tensor& w, int64_t num_heads) { return permute_head_rows(w, num_heads, false); }

std::string hf_parameter_name(const std::string& n) {
  static const std::regex layer(R"(layers\.(\d+)\.(.+))");
  static const std::map<std::string, std::string> within = {
      {"attn.q_proj.weight", "self_attn.q_proj.weight"},  {"attn.k_proj.weight", "self_attn.k_proj.weight"},
      {"attn.v_proj.weight", "self_attn.v_proj.weight"},  {"attn.output_proj.weight", "self_attn.o_proj.weight"},
      {"ffn.w1.weight", "mlp.gate_proj.weight"},          {"ffn.w3.weight", "mlp.up_proj.weight"},
      {"ffn.w2.weight", "mlp.down_proj.weight"},          {"ln1.weight", "input_layernorm.weight"},
      {"ln2.weight", "post_attention_layernorm.weight"}};
  if (n == "token_embeddings.weight") return "model.embed_tokens.weight";
  if (n == "ln_final.weight") return "model.norm.weight";
  if (n == "lm_head.weight") return "lm_head.weight";
  std::smatch m;
  if (std::regex_match(n, m, layer)) {
    auto it = within.find(m[2].str());
    if (it != within.end()) return "model.layers." + m[1].str() + "." + it->second;
  }
  LOOM_FAIL("hf_parameter_name: no Hugging Face name for loom parameter '", n, "'");
}

std::optional<std::string> loom_parameter_name(const std::string& n) {
  static const std::regex layer(R"(model\.layers\.(\d+)\.(.+))");
  static const std::map<std::string, std::string> within = {
      {"self_attn.q_proj.weight", "attn.q_proj.weight"},  {"self_attn.k_proj.weight", "attn.k_proj.weight"},
      {"self_attn.v_proj.weight", "attn.v_proj.weight"},  {"self_attn.o_proj.weight", "attn.output_proj.weight"},
      {"mlp.gate_proj.weight", "ffn.w1.weight"},          {"mlp.up_proj.weight", "ffn.w3.weight"},
      {"mlp.down_proj.weight", "ffn.w2.weight"},          {"input_layernorm.weight", "ln1.weight"},
      {"post_attention_layernorm.weight", "ln2.weight"}};
  if (n == "model.embed_tokens.weight") return "token_embeddings.weight";
  if (n == "model.norm.weight") return "ln_final.weight";
  if (n == "lm_head.weight") return "lm_head.weight";
  std::smatch m;
  if (std::regex_match(n, m, layer)) {
    auto it = within.find(m[2].str());
    if (it != within.end()) return "layers." + m[1].str() + "." + it->second;
  }
  return std::nullopt;
}

namespace {
bool is_qk(const std::string& loom_name) {
  return loom_name.ends_with("attn.q_proj.weight") || loom_name.ends_with("attn.k_proj.weight");
}
// Heads in the rows of a q or k projection: k has the k/v heads (fewer with grouped-query attention).
int64_t heads_in_rows(const std::string& loom_name, const llama::Config& c) {
  return loom_name.ends_with("attn.k_proj.weight") ? c.kv_heads() : c.num_heads;
}
}  // namespace

void export_hf(const llama::TransformerLM& model, const tokenizer::Tokenizer* tok, const std::string& out_dir) {
  const llama::Config& c = model.config();
  fs::create_directories(out_dir);
  io::NamedTensors tensors;
  for (nn::Parameter* p : const_cast<llama::TransformerLM&>(model).parameters()) {
    Tensor v = p->value.detach();
    if (is_qk(p->name)) v = interleaved_to_rotate_half(v, heads_in_rows(p->name, c));
    tensors.emplace_back(hf_parameter_name(p->name), v);
  }
  io::write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});

  std::optional<int64_t> eot;
  if (tok) {
    if (auto id = tok->special_token_id("<|endoftext|>")) eot = static_cast<int64_t>(*id);
  }
  json config = {{"architectures", {"LlamaForCausalLM"}},
                 {"model_type", "llama"},
                 {"hidden_size", c.d_model},
                 {"intermediate_size", c.d_ff},
                 {"num_attention_heads", c.num_heads},
                 {"num_key_value_heads", c.kv_heads()},
                 {"num_hidden_layers", c.num_layers},
                 {"head_dim", c.head_dim()},
                 {"hidden_act", "silu"},
                 {"rms_norm_eps", float_json(c.norm_eps)},
                 {"rope_theta", float_json(c.rope_theta)},
                 {"rope_scaling", nullptr},
                 {"vocab_size", c.vocab_size},
                 {"max_position_embeddings", c.context_length},
                 {"tie_word_embeddings", false},
                 {"attention_bias", false},
                 {"attention_dropout", 0.0},
                 {"mlp_bias", false},
                 {"initializer_range", 0.02},
                 {"pretraining_tp", 1},
                 {"use_cache", true},
                 {"torch_dtype", "float32"}};
  json generation = {{"_from_model_config", true}, {"max_length", c.context_length}};
  if (eot) {
    config["bos_token_id"] = *eot;
    config["eos_token_id"] = *eot;
    generation["bos_token_id"] = *eot;
    generation["eos_token_id"] = *eot;
  }
  write_json_file(fs::path(out_dir) / "config.json", config);
  write_json_file(fs::path(out_dir) / "generation_config.json", generation);
  if (tok) {
    // Merges as "a b" strings, the form every version of HF tokenizers reads (the ["a", "b"] pairs loom
    // writes by default need tokenizers >= 0.20). Byte-level tokens never contain a space (it is Ġ).
    json tj = json::parse(tokenizer::to_hf_json(*tok));
    json& merges = tj["model"]["merges"];
    bool plain = true;
    for (const auto& m : merges) {
      plain &= m.is_array() && m.size() == 2 && m[0].get<std::string>().find(' ') == std::string::npos &&
               m[1].get<std::string>().find(' ') == std::string::npos;
    }
    if (plain) {
      for (auto& m : merges) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    }
    write_json_file(fs::path(out_dir) / "tokenizer.json", tj);
    json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
               {"model_max_length", c.context_length},
               {"clean_up_tokenization_spaces", false},
               {"add_bos_token", false},
               {"add_eos_token", false}};
    if (eot) {
      const std::string text = "<|endoftext|>";
      tc["bos_token"] = text;
      tc["eos_token"] = text;
      tc["unk_token"] = text;
    }
    write_json_file(fs::path(out_dir) / "tokenizer_config.json", tc);
  }
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || !fs::exists(fs::path(path) / "config.json", ec)) return false;
  json j = io::try_parse_json(tokenizer::read_file((fs::path(path) / "config.json").string()));
  return j.is_object() && (j.contains("model_type") || j.contains("architectures"));
}

HfImport import_hf(const std::string& dir) {
  const fs::path root(dir);
  LOOM_CHECK(fs::is_directory(root), "HF import: \"", dir, "\" is not a directory");
  const fs::path config_path = root / "config.json";
  LOOM_CHECK(fs::exists(config_path), "HF import: \"", dir, "\" has no config.json");
  const llama::Config cfg = config_from_hf(read_json_file(config_path), config_path.string());

  // The weight files: one model.safetensors, or the shards of model.safetensors.index.json.
  std::vector<std::string> files;
  if (fs::exists(root / "model.safetensors")) {
    files.push_back((root / "model.safetensors").string());
  } else if (fs::exists(root / "model.safetensors.index.json")) {
    json index = read_json_file(root / "model.safetensors.index.json");
    LOOM_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), dir,
               "/model.safetensors.index.json has no weight_map");
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
    for (const auto& s : shards) files.push_back((root / s).string());
  } else {
    LOOM_FAIL("HF import: \"", dir, "\" has no model.safetensors or model.safetensors.index.json",
              fs::exists(root / "pytorch_model.bin") ? " (pytorch_model.bin is not supported: convert it to safetensors)"
                                                    : "");
  }

  HfImport out;
  out.model = std::make_unique<llama::TransformerLM>(cfg, 0);
  std::set<std::string> loaded;
  std::optional<Tensor> embed;
  for (const auto& path : files) {
    io::SafetensorsFile file = io::SafetensorsFile::open(path);
    for (const std::string& hf : file.names()) {
      if (hf.ends_with("rotary_emb.inv_freq")) continue;  // a buffer older transformers saved, recomputed
      auto name = loom_parameter_name(hf);
      LOOM_CHECK(name.has_value(), path, ": tensor '", hf,
                 "' is not part of loom's Llama (biases and other extra weights are not supported)");
      LOOM_CHECK(!loaded.count(*name), path, ": tensor '", hf, "' appears twice");
      Tensor v = read_as_f32(file, hf);
      LOOM_CHECK(v.shape() == out.model->parameter(*name).value.shape(), path, ": '", hf, "' has shape ", v.shape(),
                 " but config.json implies ", out.model->parameter(*name).value.shape());
      if (is_qk(*name)) v = rotate_half_to_interleaved(v, heads_in_rows(*name, cfg));
      if (*name == "token_embeddings.weight") embed = v;
      out.model->load_parameter(*name, v);
      loaded.insert(*name);
    }
  }
  if (!loaded.count("lm_head.weight") && embed) {
    // Tied embeddings (tie_word_embeddings, or a checkpoint that omits lm_head): loom's head is untied, so
    // it gets a copy, which computes the same logits.
    out.model->load_parameter("lm_head.weight", *embed);
    loaded.insert("lm_head.weight");
    out.notes.push_back("lm_head.weight is tied to model.embed_tokens.weight: copied into loom's untied lm_head");
  }
  for (nn::Parameter* p : out.model->parameters()) {
    LOOM_CHECK(loaded.count(p->name), "HF import: \"", dir, "\" has no tensor '", hf_parameter_name(p->name), "'");
  }

  const fs::path tok = root / "tokenizer.json";
  if (fs::exists(tok)) {
    try {
      out.tokenizer = tokenizer::load_tokenizer(tok.string());
    } catch (const Error& e) {
      out.notes.push_back(str("tokenizer.json not imported (loom reads byte-level BPE only): ", e.what()));
    }
  } else {
    out.notes.push_back("no tokenizer.json");
  }
  return out;
}

}  // namespace loom::train
