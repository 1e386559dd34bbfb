#include "models/hf.h"
#include "io/json.h"

#include <charconv>
#include <cstring>
#include <set>

#include "io/file.h"
#include "io/json_checked.h"
#include "tokenizer/formats.h"

namespace loom::models {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

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

std::string hf_model_type(const json& config) {
  if (config.contains("model_type") && config["model_type"].is_string()) return config["model_type"].get<std::string>();
  return "";
}

}  // namespace

Tensor hf_read_as_f32(const io::SafetensorsFile& file, const std::string& name) {
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

json hf_read_json(const fs::path& path) {
  json j = io::try_parse_json(tokenizer::read_file(path.string()));
  LOOM_CHECK(!j.is_discarded() && j.is_object(), path.string(), " is not a JSON object");
  return j;
}

void hf_write_json(const fs::path& path, const json& j) {
  const std::string text = j.dump(2) + "\n";
  io::write_file_atomically(path.string(), [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
}

json hf_float(float f) { return json(io::float_for_json(f)); }

std::vector<std::string> hf_weight_files(const std::string& dir) {
  const fs::path root(dir);
  std::vector<std::string> files;
  if (fs::exists(root / "model.safetensors")) {
    files.push_back((root / "model.safetensors").string());
  } else if (fs::exists(root / "model.safetensors.index.json")) {
    json index = hf_read_json(root / "model.safetensors.index.json");
    LOOM_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), dir,
               "/model.safetensors.index.json has no weight_map");
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      LOOM_CHECK(shard.is_string() && shard.get<std::string>().find('/') == std::string::npos, dir,
                 "/model.safetensors.index.json: weight_map entry '", name, "' must name a file in the directory");
      shards.insert(shard.get<std::string>());
    }
    for (const auto& s : shards) files.push_back((root / s).string());
  } else {
    LOOM_FAIL("HF import: \"", dir, "\" has no model.safetensors or model.safetensors.index.json",
              fs::exists(root / "pytorch_model.bin") ? " (pytorch_model.bin is not supported: convert it to safetensors)"
                                                    : "");
  }
  return files;
}

void hf_for_each_tensor(const std::string& dir,
                        const std::function<void(const io::SafetensorsFile&, const std::string&)>& visit) {
  std::set<std::string> seen;
  for (const auto& path : hf_weight_files(dir)) {
    io::SafetensorsFile file = io::SafetensorsFile::open(path);
    for (const std::string& name : file.names()) {
      LOOM_CHECK(seen.insert(name).second, path, ": tensor '", name, "' appears twice");
      visit(file, name);
    }
  }
}

std::set<std::string> hf_tensor_names(const std::string& dir) {
  std::set<std::string> names;
  hf_for_each_tensor(dir, [&](const io::SafetensorsFile&, const std::string& name) { names.insert(name); });
  return names;
}

void hf_write_tensors(const LanguageModel& model, const TensorTable& table, const std::string& out_dir) {
  io::write_safetensors((fs::path(out_dir) / "model.safetensors").string(),
                        export_tensors(table, TensorFormat::Hf, model), {{"format", "pt"}});
}

void hf_write_configs(const std::string& out_dir, json config, json generation, const tokenizer::Tokenizer* tok,
                      int64_t model_max_length, bool gpt2_files) {
  if (std::optional<int64_t> eot = hf_end_of_text(tok)) {
    for (json* j : {&config, &generation}) {
      (*j)["bos_token_id"] = *eot;
      (*j)["eos_token_id"] = *eot;
    }
  }
  hf_write_json(fs::path(out_dir) / "config.json", config);
  hf_write_json(fs::path(out_dir) / "generation_config.json", generation);
  if (tok) hf_write_tokenizer(*tok, out_dir, model_max_length, gpt2_files);
}

HfImport hf_import_model(std::unique_ptr<LanguageModel> model, const TensorTable& table, const std::string& dir,
                         const TensorImportOptions& options, std::vector<std::string> notes) {
  TensorImport in(table, TensorFormat::Hf, *model, options);
  hf_for_each_tensor(dir, [&](const io::SafetensorsFile& file, const std::string& name) {
    if (in.ignored(name)) return;
    const StoredTensor* t = in.find(name);
    LOOM_CHECK(t != nullptr, file.path(), ": tensor '", name, "' is not part of loom's ", table.family,
               options.unknown_hint);
    Tensor v = hf_read_as_f32(file, name);
    LOOM_CHECK(v.shape() == in.shape(*t), file.path(), ": '", name, "' has shape ", v.shape(),
               " but config.json implies ", in.shape(*t));
    in.load(*t, v, file.path());
  });
  in.finish(str("HF import: \"", dir, "\""), notes);
  HfImport out;
  out.model = std::move(model);
  out.notes = std::move(notes);
  hf_read_tokenizer(dir, out);
  return out;
}

std::optional<int64_t> hf_end_of_text(const tokenizer::Tokenizer* tok) {
  if (tok) {
    if (auto id = tok->special_token_id("<|endoftext|>")) return static_cast<int64_t>(*id);
  }
  return std::nullopt;
}

void hf_write_tokenizer(const tokenizer::Tokenizer& tok, const std::string& out_dir, int64_t model_max_length,
                        bool gpt2_files) {
  // Merges as "a b" strings, the form every version of HF tokenizers reads (the ["a", "b"] pairs loom
  // writes by default need tokenizers >= 0.20). Byte-level tokens never contain a space (it is Ġ).
  json tj = json::parse(tokenizer::to_hf_json(tok));
  json& merges = tj["model"]["merges"];
  bool plain = true;
  for (const auto& m : merges) {
    plain &= m.is_array() && m.size() == 2 && m[0].get<std::string>().find(' ') == std::string::npos &&
             m[1].get<std::string>().find(' ') == std::string::npos;
  }
  if (plain) {
    for (auto& m : merges) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  }
  hf_write_json(fs::path(out_dir) / "tokenizer.json", tj);
  json tc = {{"tokenizer_class", gpt2_files ? "GPT2Tokenizer" : "PreTrainedTokenizerFast"},
             {"model_max_length", model_max_length},
             {"clean_up_tokenization_spaces", false},
             {"add_bos_token", false},
             {"add_eos_token", false}};
  if (hf_end_of_text(&tok)) {
    const std::string text = "<|endoftext|>";
    tc["bos_token"] = text;
    tc["eos_token"] = text;
    tc["unk_token"] = text;
  }
  hf_write_json(fs::path(out_dir) / "tokenizer_config.json", tc);
  if (gpt2_files) tokenizer::save_gpt2_files(tok, out_dir);
}

void hf_read_tokenizer(const std::string& dir, HfImport& out) {
  const fs::path root(dir);
  std::string path;
  if (fs::exists(root / "tokenizer.json")) {
    path = (root / "tokenizer.json").string();
  } else if (fs::exists(root / "vocab.json") && fs::exists(root / "merges.txt")) {
    path = root.string();
  }
  if (path.empty()) {
    out.notes.push_back("no tokenizer.json (or vocab.json + merges.txt)");
    return;
  }
  try {
    out.tokenizer = tokenizer::load_tokenizer(path);
  } catch (const Error& e) {
    out.notes.push_back(str("tokenizer not imported (loom reads byte-level BPE only): ", e.what()));
  }
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || !fs::exists(fs::path(path) / "config.json", ec)) return false;
  json j = io::try_parse_json(tokenizer::read_file((fs::path(path) / "config.json").string()));
  return j.is_object() && (j.contains("model_type") || j.contains("architectures"));
}

void export_hf(const LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& out_dir) {
  const Family& f = model.model_config().family();
  LOOM_CHECK(f.export_hf != nullptr, "export: the ", f.arch, " family has no Hugging Face export");
  fs::create_directories(out_dir);
  f.export_hf(model, tok, out_dir);
}

HfImport import_hf(const std::string& dir) {
  const fs::path root(dir);
  LOOM_CHECK(fs::is_directory(root), "HF import: \"", dir, "\" is not a directory");
  const fs::path config_path = root / "config.json";
  LOOM_CHECK(fs::exists(config_path), "HF import: \"", dir, "\" has no config.json");
  const json config = hf_read_json(config_path);
  const std::string type = hf_model_type(config);
  const Family* f = family_for_hf(type);
  if (f == nullptr || f->import_hf == nullptr) {
    std::string known;
    for (const Family* g : families()) {
      if (g->import_hf) known += (known.empty() ? "" : ", ") + g->hf_model_type;
    }
    LOOM_FAIL(config_path.string(), ": model_type \"", type, "\" is not supported (loom imports: ", known, ")");
  }
  return f->import_hf(dir, config);
}

}  // namespace loom::models
