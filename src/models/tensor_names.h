// A family's tensor names in Hugging Face and GGUF files: one table per family, and the loops over it
// written once here (models/hf.cpp and models/gguf.cpp read and write the files). As in llama.cpp
// (src/llama-arch.cpp), the names live in a table per architecture and the loaders loop over it.
//
// A row maps a loom tensor name pattern to its HF and GGUF names and says how the stored tensor differs
// from loom's:
//   {"layers.{i}.attn.q_proj.weight", "model.layers.{i}.self_attn.q_proj.weight", "blk.{i}.attn_q.weight",
//    {.hf = Change::RopeToRotateHalf, .rope = q_rows}}
// Patterns: {i} stands for a number that ranges over a count of the model's config (TensorTable::counts
// maps i to num_layers); {k+num_layers} is k plus the config's num_layers (DeepSeek-V3 stores its MTP
// modules as the layers after the last block). A placeholder that only the stored name has makes one
// stored tensor per value: a slice of loom's tensor (Change::Slice) or a duplicate of it (Change::Copy).
//
// Export walks the table in order, rows with the same placeholders layer by layer (llama.cpp's order:
// the embedding, each block, the final norm, the head), and writes every loom tensor the model has; a
// parameter or state tensor no row names is an error. Import expects the stored tensors of the tensors
// the model has, in any order, and loads each into its loom tensor(s).
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "models/model.h"

namespace loom::models {

enum class TensorFormat { Hf, Gguf };

// How a stored tensor differs from loom's: export applies it, import undoes it.
enum class Change {
  None,
  Transpose,          // stored [in, out]: HF's Conv1D (GPT-2)
  RopeToRotateHalf,   // each head's RoPE rows: loom's pairs (2i, 2i+1) stored as HF's rotate-half (i, i+D/2)
  RopeToInterleaved,  // the reverse: loom's rotate-half pairs stored interleaved (DeepSeek-V3's checkpoints)
  SwapColumnHalves,   // [R, 2C] with its two column halves swapped (DeepSeek-V3's eh_proj)
  Slice,              // one stored tensor per index of loom's dim 0 (the experts of an [E, ., .] parameter)
  Copy,               // a duplicate of loom's tensor; on import it must equal it
};

// The rows of a q or k projection that RoPE reorders: `heads` segments of `nope` rows it leaves alone,
// then `rope` rows it rotates.
struct RopeRows {
  int64_t heads = 1;
  int64_t nope = 0;
  int64_t rope = 0;
};

// q, k and v stacked on dim 0 in one stored tensor (GPT-2's c_attn, GGUF's attn_qkv): this row's
// tensor is part `index` of `count`.
struct Part {
  int index = 0;
  int count = 1;
};

// What a row needs besides its names (designated initializers: {.hf = Change::Transpose}).
struct Conversion {
  Change hf = Change::None;
  Change gguf = Change::None;
  RopeRows (*rope)(const nlohmann::json& model) = nullptr;  // Rope*: the rows, from the model section
  Part part = {};
  // A tensor that may be tied to this one (an LM head to the embedding). On import, a model that holds
  // it while the file does not gets a copy (with a note); a model that ties it (GPT-2's tied head, which
  // has no lm_head) accepts a stored one that equals it. GGUF export leaves it out when equal bit for
  // bit, as llama.cpp's converter does (so an untied GPT-2 whose head equals its embedding comes back
  // tied: the same function).
  const char* tied_to = nullptr;
  // A bias the model lacks (GPT-2 without q/k/v or output bias) is exported as zeros: the same function.
  bool zeros_if_absent = false;
  // Absent on import: a note "no '<name>': <if_absent>" instead of an error.
  const char* if_absent = nullptr;
};

struct TensorName {
  std::string loom;
  std::string hf;    // "" when HF files do not hold it
  std::string gguf;  // "" when GGUF files do not hold it (or the family has no GGUF)
  Conversion how = {};
};

// (Members initialized, so a table's designated initializers may leave any out.)
struct TensorTable {
  std::string family{};                                       // in messages: "is not part of loom's Llama"
  std::vector<std::pair<std::string, std::string>> counts{};  // placeholder -> the config key of its count
  std::vector<TensorName> rows{};
  // HF tensors import skips (buffers, not weights): '*' matches any text, {i} a number.
  std::vector<std::string> hf_ignored{};
  std::string hf_optional_prefix{};  // an HF name may lack it on import (GPT-2's "transformer.")
};

// One tensor of a file as the table gives it for a config.
struct StoredTensor {
  std::string name;
  std::vector<std::string> loom;  // the loom tensor, or the parts of a fused one in order
  const TensorName* row = nullptr;
  Change change = Change::None;   // the row's change for this format
  int64_t index = 0;              // Change::Slice: the index along loom's dim 0
};

// The stored tensors of a model with this `model` section, in export order (whether the model holds
// each loom tensor is not checked here).
std::vector<StoredTensor> stored_tensors(const TensorTable& table, TensorFormat format, const nlohmann::json& model);

// The stored name of one loom tensor (an error naming it when no row has one), and back (nullopt when
// no row has the name). `model` resolves {k+key} offsets; without it such rows are not matched.
std::string stored_name(const TensorTable& table, TensorFormat format, const std::string& loom,
                        const nlohmann::json* model = nullptr);
std::optional<std::string> loom_name(const TensorTable& table, TensorFormat format, const std::string& stored,
                                     const nlohmann::json* model = nullptr);
// The row stored_name takes its name from (nullptr when no row names `loom` in this format).
const TensorName* row_for(const TensorTable& table, TensorFormat format, const std::string& loom,
                          const nlohmann::json* model = nullptr);

// Every parameter and state tensor of `model` under its stored name, converted, in export order.
std::vector<std::pair<std::string, Tensor>> export_tensors(const TensorTable& table, TensorFormat format,
                                                           const LanguageModel& model);

struct TensorImportOptions {
  bool rope_rows_as_stored = false;    // the file's RoPE rows are already in loom's order
  std::vector<std::string> ignored{};  // more stored names to skip (as TensorTable::hf_ignored)
  std::string unknown_hint{};          // appended to "is not part of loom's <family>"
  // Loom tensors the caller fills itself (matrices a GGUF import holds quantized only): their stored
  // tensors are not loaded (held_elsewhere() tells the format's loop to skip them, before converting
  // anything), and a tie that would copy into one of them is not made.
  std::set<std::string> held_elsewhere{};
};

// Loads the stored tensors of one model, in any order: the format's loop asks find() and shape() for
// each tensor of the file, load()s it, and finish()es.
class TensorImport {
 public:
  TensorImport(const TensorTable& table, TensorFormat format, LanguageModel& model, TensorImportOptions options = {});

  // Whether the file's tensor `name` is to be skipped.
  bool ignored(const std::string& name) const;
  // The expected tensor of that name, or nullptr when it is not part of the model.
  const StoredTensor* find(const std::string& name) const;
  // Its shape as stored.
  const Shape& shape(const StoredTensor& t) const;
  // Undoes the change and loads; `where` (the file) names it in errors.
  void load(const StoredTensor& t, const Tensor& stored, const std::string& where);
  // Whether every loom tensor of `t` is in options.held_elsewhere; then mark_held() stands for load().
  bool held_elsewhere(const StoredTensor& t) const;
  void mark_held(const StoredTensor& t, const std::string& where);
  // The f32 parameter `t` fills as stored (no change, one loom tensor of the stored shape, not sharded),
  // for a format that decodes straight into it and then calls mark_held(): no stored copy of the tensor
  // exists beside the parameter while loading. Undefined when `t` needs load().
  Tensor destination(const StoredTensor& t) const;
  // Ties, slices and duplicates, and the tensors the file lacked: an error naming the first one (`where`
  // leads the message), or a note.
  void finish(const std::string& where, std::vector<std::string>& notes);

 private:
  struct Expected {
    StoredTensor tensor;
    Shape shape{};
    bool present = false;  // the model holds its loom tensors (else: a tie the model keeps itself)
    bool loaded = false;
  };
  Expected& expected(const StoredTensor& t);
  void put(const std::string& loom, const Tensor& value);

  const TensorTable& table_;
  TensorFormat format_;
  LanguageModel& model_;
  TensorImportOptions options_;
  std::vector<Expected> expected_;
  std::map<std::string, size_t> by_name_;
  std::set<std::string> state_;                        // the model's state tensors (the rest are parameters)
  std::map<std::string, Tensor> slices_;               // loom name -> the [E, ...] being assembled
  std::vector<std::pair<size_t, Tensor>> duplicates_;  // stored values that must equal a loom tensor
};

// The RoPE row reordering behind Change::Rope*, for tests and tools: w [heads * (nope + rope), C].
Tensor reorder_rope_rows(const Tensor& w, const RopeRows& rows, bool to_interleaved);

}  // namespace loom::models
