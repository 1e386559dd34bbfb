#include "models/gguf.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/json.h"
#include "models/hf.h"
#include "tokenizer/formats.h"

namespace loom::models {
namespace fs = std::filesystem;
using nlohmann::json;

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

GgufImport import_gguf(const std::string& path, bool quantized, bool quantized_only) {
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const gguf::Header& h = file.header();
  std::string arch;
  try {
    arch = h.get_string("general.architecture");
  } catch (const Error& e) {
    LOOM_FAIL(path, ": ", e.what());
  }
  const Family* f = family_for_gguf(arch);
  if (f == nullptr || !f->import_gguf) {
    std::string known;
    for (const Family* g : families()) {
      if (g->import_gguf) known += (known.empty() ? "" : ", ") + g->gguf_arch;
    }
    LOOM_FAIL(path, ": general.architecture ", gguf::quoted(arch), " is not supported (loom reads: ", known, ")");
  }
  GgufImport out;
  const GgufMatrices matrices = !quantized        ? GgufMatrices::F32
                                : quantized_only ? GgufMatrices::QuantizedOnly
                                                 : GgufMatrices::AlsoQuantized;
  out.model = f->import_gguf(file, matrices, out.notes);
  if (gguf::has_tokenizer(h)) {
    try {
      gguf::GgufTokenizer t = gguf::tokenizer_from_gguf(h);
      out.tokenizer = std::move(t.tokenizer);
      out.bos = t.bos;
      out.eos = t.eos;
      out.chat_template = std::move(t.chat_template);
      if (t.pre == "smollm") {
        out.notes.push_back("tokenizer.ggml.pre \"smollm\": split with GPT-2's regex, as transformers' GGUF loader does "
                            "(llama.cpp also isolates each digit first; see docs/gguf.md)");
      }
    } catch (const Error& e) {
      LOOM_FAIL(path, ": ", e.what());
    }
    LOOM_CHECK(static_cast<int64_t>(out.tokenizer->vocab_size()) <= out.model->vocab_size(), path, ": the tokenizer has ",
               out.tokenizer->vocab_size(), " tokens but the model's vocabulary only ", out.model->vocab_size());
  } else {
    out.notes.push_back("no tokenizer in the file (no tokenizer.ggml.model)");
  }
  return out;
}

quant::QuantType gguf_export_type(const std::string& name) {
  std::string upper;
  for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  using quant::QuantType;
  for (QuantType t : {QuantType::F32, QuantType::F16, QuantType::BF16, QuantType::Q8_0, QuantType::Q4_0, QuantType::Q4_1}) {
    if (upper == quant::quant_type_name(t)) return t;
  }
  LOOM_FAIL("GGUF export type \"", name, "\" is not supported (choose f32, f16, bf16, q8_0, q4_0 or q4_1)");
}

namespace {
// general.file_type is llama.cpp's llama_ftype ("mostly" this type), not the ggml type id.
uint32_t llama_file_type(quant::QuantType t) {
  switch (t) {
    case quant::QuantType::F32: return 0;
    case quant::QuantType::F16: return 1;
    case quant::QuantType::Q4_0: return 2;
    case quant::QuantType::Q4_1: return 3;
    case quant::QuantType::Q8_0: return 7;
    case quant::QuantType::BF16: return 32;
    default: LOOM_FAIL("GGUF export type ", quant::quant_type_name(t), " has no llama.cpp file type");
  }
}
}  // namespace

void export_gguf(const LanguageModel& model, const tokenizer::Tokenizer* tok, const std::string& path,
                 const GgufExportOptions& o) {
  const Family& f = model.model_config().family();
  LOOM_CHECK(f.export_gguf != nullptr, "export: the ", f.arch, " family has no GGUF export");
  std::vector<gguf::KeyValue> kv = {{"general.architecture", gguf::Value{f.gguf_arch}},
                                    {"general.type", gguf::Value{std::string("model")}},
                                    {"general.name", gguf::Value{o.name.empty() ? std::string("loom model") : o.name}},
                                    {"general.file_type", gguf::Value{llama_file_type(o.type)}},
                                    {"general.quantization_version", gguf::Value{uint32_t{2}}}};
  std::vector<GgufTensorOut> tensors;
  f.export_gguf(model, kv, tensors);
  if (tok) {
    for (auto& e : gguf::tokenizer_metadata(*tok, o.bos, o.eos, o.chat_template)) kv.push_back(std::move(e));
  }
  // Stored bytes, kept alive until written.
  std::vector<std::vector<uint8_t>> storage(tensors.size());
  std::vector<gguf::TensorEntry> entries;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorOut& t = tensors[i];
    LOOM_ASSERT(t.value.dtype() == DType::F32 && t.value.device().is_cpu(), "GGUF export of ", t.name);
    const quant::QuantType type = t.matrix ? o.type : quant::QuantType::F32;
    std::vector<uint64_t> ne;
    for (int d = t.value.shape().ndim() - 1; d >= 0; --d) ne.push_back(static_cast<uint64_t>(t.value.shape()[d]));
    const int64_t row = t.value.shape()[t.value.shape().ndim() - 1];
    LOOM_CHECK(row % quant::block_elements(type) == 0, "GGUF export: ", t.name, " has rows of ", row,
               " values, not a whole number of ", quant::quant_type_name(type), " blocks of ", quant::block_elements(type),
               " (choose another --gguf-type)");
    const int64_t rows = t.value.numel() / row;
    const int64_t rb = quant::row_bytes(type, row);
    storage[i].resize(static_cast<size_t>(rb * rows));
    const float* x = t.value.data<float>();
    for (int64_t r = 0; r < rows; ++r) quant::quantize(type, x + r * row, row, storage[i].data() + r * rb);
    entries.push_back({t.name, ne, type, storage[i].data(), storage[i].size()});
  }
  gguf::write_gguf_file(path, kv, entries);
}

void gguf_tensors_of(const LanguageModel& model, const TensorTable& table, std::vector<GgufTensorOut>& tensors) {
  for (auto& [name, v] : export_tensors(table, TensorFormat::Gguf, model)) {
    const bool matrix = v.shape().ndim() == 2;
    tensors.push_back({name, std::move(v), matrix});
  }
}

void gguf_load_tensors(LanguageModel& model, const TensorTable& table, const gguf::GgufFile& file,
                       std::vector<std::string>& notes, const std::set<std::string>& held_quantized) {
  TensorImportOptions options;
  options.held_elsewhere = held_quantized;
  TensorImport in(table, TensorFormat::Gguf, model, options);
  for (const gguf::TensorInfo& t : file.header().tensors) {
    const StoredTensor* s = in.find(t.name);
    LOOM_CHECK(s != nullptr, file.path(), ": tensor ", gguf::quoted(t.name), " (", quant::quant_type_name(t.type),
               ") is not part of loom's ", table.family);
    LOOM_CHECK(file.shape(t.name) == in.shape(*s), file.path(), ": tensor ", gguf::quoted(t.name), " has shape ",
               file.shape(t.name), " (ne reversed) but the metadata implies ", in.shape(*s));
    if (in.held_elsewhere(*s)) {  // never dequantized: the caller holds its blocks
      in.mark_held(*s, file.path());
      continue;
    }
    // Decoded straight into its parameter when stored as loom keeps it (the common case): a whole stored
    // copy beside the parameter would raise the peak memory of loading by the largest tensor (SmolLM2's
    // embedding: 113 MiB), and stay in the allocator's cache afterwards.
    if (Tensor dst = in.destination(*s); dst.defined()) {
      quant::dequantize(t.type, file.bytes(t.name).data(), dst.numel(), dst.data<float>());
      nn::Parameter& p = model.parameter(s->loom[0]);
      p.value_changed();
      in.mark_held(*s, file.path());
      continue;
    }
    in.load(*s, file.dequantized(t.name), file.path());
  }
  in.finish(file.path(), notes);
}

int64_t gguf_positive_key(const gguf::Header& h, const std::string& key) {
  const uint64_t v = h.get_uint(key);
  LOOM_CHECK(v >= 1 && v <= (uint64_t{1} << 40), "metadata ", gguf::quoted(key), " is ", v, ", expected a positive size");
  return static_cast<int64_t>(v);
}

int64_t gguf_vocab_size(const gguf::Header& h, const std::string& arch) {
  const std::string key = arch + ".vocab_size";
  if (h.find(key)) return gguf_positive_key(h, key);
  const gguf::TensorInfo* e = h.find_tensor("token_embd.weight");
  LOOM_CHECK(e != nullptr && e->ne.size() == 2, "no ", key, " and no 2-D token_embd.weight to take it from");
  return static_cast<int64_t>(e->ne[1]);
}

void write_tokenizer_config(const std::string& dir, const tokenizer::Tokenizer& tok, std::optional<tokenizer::TokenId> bos,
                            std::optional<tokenizer::TokenId> eos, const std::string& chat_template,
                            int64_t model_max_length) {
  json tc = {{"tokenizer_class", "PreTrainedTokenizerFast"},
             {"model_max_length", model_max_length},
             {"clean_up_tokenization_spaces", false},
             {"add_bos_token", false},
             {"add_eos_token", false}};
  if (bos) tc["bos_token"] = tok.token_bytes(*bos);
  if (eos) tc["eos_token"] = tok.token_bytes(*eos);
  if (tok.unknown_token()) tc["unk_token"] = tok.token_bytes(*tok.unknown_token());
  if (!chat_template.empty()) tc["chat_template"] = chat_template;
  hf_write_json(fs::path(dir) / "tokenizer_config.json", tc);
}

void read_tokenizer_config(const std::string& dir, const tokenizer::Tokenizer& tok, GgufExportOptions& o) {
  const fs::path p = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(p)) return;
  const json tc = hf_read_json(p);
  auto id_of = [&](const char* key) -> std::optional<tokenizer::TokenId> {
    if (!tc.contains(key) || !tc[key].is_string()) return std::nullopt;
    auto id = tok.token_id(tc[key].get<std::string>());
    LOOM_CHECK(id.has_value(), p.string(), ": ", key, " \"", tc[key].get<std::string>(), "\" is not in the tokenizer");
    return id;
  };
  if (auto b = id_of("bos_token")) o.bos = b;
  if (auto e = id_of("eos_token")) o.eos = e;
  if (tc.contains("chat_template") && tc["chat_template"].is_string()) o.chat_template = tc["chat_template"].get<std::string>();
}

}  // namespace loom::models
