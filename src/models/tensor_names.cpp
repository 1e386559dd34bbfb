#include "models/tensor_names.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <string_view>

namespace loom::models {
using nlohmann::json;

namespace {

const char* format_name(TensorFormat f) { return f == TensorFormat::Hf ? "Hugging Face" : "GGUF"; }

const std::string& pattern_of(const TensorName& row, TensorFormat f) {
  return f == TensorFormat::Hf ? row.hf : row.gguf;
}

Change change_of(const TensorName& row, TensorFormat f) { return f == TensorFormat::Hf ? row.how.hf : row.how.gguf; }

// ---- patterns: literal text and {name} or {name+config_key} placeholders ---------------------------------

struct Piece {
  std::string text;  // the literal, or the placeholder's name
  bool placeholder = false;
  std::string offset{};  // a config key whose value is added ({k+num_layers})
};

std::vector<Piece> parse(const std::string& pattern) {
  std::vector<Piece> out;
  size_t at = 0;
  while (at < pattern.size()) {
    const size_t open = pattern.find('{', at);
    if (open != at) {
      out.push_back({pattern.substr(at, open - at)});
      if (open == std::string::npos) break;
    }
    const size_t close = pattern.find('}', open);
    LOOM_ASSERT(close != std::string::npos, "unclosed placeholder in tensor name pattern ", pattern);
    const std::string inside = pattern.substr(open + 1, close - open - 1);
    const size_t plus = inside.find('+');
    out.push_back({inside.substr(0, plus), true, plus == std::string::npos ? "" : inside.substr(plus + 1)});
    at = close + 1;
  }
  return out;
}

std::vector<std::string> placeholders(const std::string& pattern) {
  std::vector<std::string> out;
  for (const Piece& p : parse(pattern)) {
    if (p.placeholder && std::find(out.begin(), out.end(), p.text) == out.end()) out.push_back(p.text);
  }
  return out;
}

int64_t config_int(const json* model, const std::string& key) {
  LOOM_ASSERT(model != nullptr && model->contains(key) && (*model)[key].is_number_integer(),
              "tensor names: config key ", key, " is not an integer of the model section");
  return (*model)[key].get<int64_t>();
}

using Values = std::map<std::string, int64_t>;

std::string substitute(const std::string& pattern, const Values& values, const json* model) {
  std::string out;
  for (const Piece& p : parse(pattern)) {
    if (!p.placeholder) {
      out += p.text;
      continue;
    }
    auto it = values.find(p.text);
    LOOM_ASSERT(it != values.end(), "tensor names: no value for {", p.text, "} in ", pattern);
    out += std::to_string(it->second + (p.offset.empty() ? 0 : config_int(model, p.offset)));
  }
  return out;
}

// The placeholder values that make `pattern` read `name`, if any.
std::optional<Values> match(const std::string& pattern, const std::string& name, const json* model) {
  Values values;
  size_t at = 0;
  for (const Piece& p : parse(pattern)) {
    if (!p.placeholder) {
      if (name.compare(at, p.text.size(), p.text) != 0) return std::nullopt;
      at += p.text.size();
      continue;
    }
    if (!p.offset.empty() && model == nullptr) return std::nullopt;
    size_t end = at;
    while (end < name.size() && end - at < 18 && name[end] >= '0' && name[end] <= '9') ++end;
    int64_t v = 0;
    if (end == at || std::from_chars(name.data() + at, name.data() + end, v).ec != std::errc()) return std::nullopt;
    v -= p.offset.empty() ? 0 : config_int(model, p.offset);
    if (v < 0 || (values.count(p.text) && values[p.text] != v)) return std::nullopt;
    values[p.text] = v;
    at = end;
  }
  if (at != name.size()) return std::nullopt;
  return values;
}

// '*' matches any text, a placeholder {x} a number, everything else itself.
bool glob_match(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern[0] == '*') {
    for (size_t at = 0; at <= name.size(); ++at) {
      if (glob_match(pattern.substr(1), name.substr(at))) return true;
    }
    return false;
  }
  if (pattern[0] == '{') {
    const size_t close = pattern.find('}');
    size_t digits = 0;
    while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9') ++digits;
    return digits > 0 && glob_match(pattern.substr(close + 1), name.substr(digits));
  }
  return !name.empty() && name[0] == pattern[0] && glob_match(pattern.substr(1), name.substr(1));
}

int64_t count_of(const TensorTable& table, const std::string& placeholder, const json& model) {
  for (const auto& [name, key] : table.counts) {
    if (name == placeholder) return config_int(&model, key);
  }
  LOOM_ASSERT(false, "tensor names of ", table.family, ": placeholder {", placeholder, "} has no count");
  return 0;
}

// ---- the changes -----------------------------------------------------------------------------------------

void check_matrix(const Tensor& w, const char* what) {
  LOOM_CHECK(w.dtype() == DType::F32 && w.shape().ndim() == 2, what, ": expected an f32 matrix, got ", w.describe());
}

// [R, C] -> [C, R].
Tensor transposed(const Tensor& w) {
  check_matrix(w, "transpose");
  const int64_t R = w.size(0), C = w.size(1);
  Tensor out = Tensor::empty({C, R}, DType::F32);
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) dst[c * R + r] = src[r * C + c];
  }
  return out;
}

// [R_i, ...] stacked on dim 0 -> [sum R_i, ...].
Tensor stacked(const std::vector<Tensor>& parts) {
  std::vector<int64_t> dims(parts[0].shape().begin(), parts[0].shape().end());
  dims[0] = 0;
  for (const Tensor& p : parts) dims[0] += p.size(0);
  Tensor out = Tensor::empty(Shape(dims), DType::F32);
  int64_t at = 0;
  for (const Tensor& p : parts) {
    std::memcpy(out.data<float>() + at, p.data<float>(), static_cast<size_t>(p.numel()) * sizeof(float));
    at += p.numel();
  }
  return out;
}

// [R, 2C] with its column halves swapped (its own inverse).
Tensor swap_column_halves(const Tensor& w) {
  check_matrix(w, "column-half swap");
  LOOM_CHECK(w.shape()[1] % 2 == 0, "column-half swap: expected [R, 2C], got ", w.shape());
  const int64_t R = w.shape()[0], C = w.shape()[1] / 2;
  Tensor out = Tensor::empty(w.shape(), DType::F32);
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(dst + r * 2 * C, src + r * 2 * C + C, static_cast<size_t>(C) * sizeof(float));
    std::memcpy(dst + r * 2 * C + C, src + r * 2 * C, static_cast<size_t>(C) * sizeof(float));
  }
  return out;
}

// loom -> stored, or stored -> loom.
Tensor convert(Change change, const Tensor& v, const StoredTensor& t, const json& model, bool to_stored) {
  switch (change) {
    case Change::None:
    case Change::Copy:
    case Change::Slice: return v;
    case Change::Transpose: return transposed(v);
    case Change::SwapColumnHalves: return swap_column_halves(v);
    case Change::RopeToRotateHalf:
    case Change::RopeToInterleaved: {
      LOOM_ASSERT(t.row->how.rope != nullptr, "tensor names: ", t.row->loom, " has a RoPE change but no rows");
      // Stored interleaved: export reorders to interleaved, import from it.
      const bool stored_interleaved = change == Change::RopeToInterleaved;
      return reorder_rope_rows(v, t.row->how.rope(model), stored_interleaved == to_stored);
    }
  }
  return v;
}

Shape stored_shape(const StoredTensor& t, const std::vector<Shape>& loom_shapes) {
  std::vector<int64_t> dims(loom_shapes[0].begin(), loom_shapes[0].end());
  for (size_t i = 1; i < loom_shapes.size(); ++i) dims[0] += loom_shapes[i][0];
  if (t.change == Change::Transpose && dims.size() == 2) std::swap(dims[0], dims[1]);
  if (t.change == Change::Slice) dims.erase(dims.begin());
  return Shape(dims);
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<float>() == b.to_vector<float>();
}

// The stored tensor(s) of one row for these placeholder values; a later part of a fused tensor joins the
// first part's, which is among out[first_of_group...].
void add_row(const TensorName& row, TensorFormat format, const Values& values, const TensorTable& table,
             const json& model, size_t first_of_group, std::vector<StoredTensor>& out) {
  const std::string& pattern = pattern_of(row, format);
  if (pattern.empty()) return;
  const std::string loom = substitute(row.loom, values, &model);
  const Change change = change_of(row, format);
  std::vector<std::string> extra;
  for (const std::string& p : placeholders(pattern)) {
    if (!values.count(p)) extra.push_back(p);
  }
  if (!extra.empty()) {
    LOOM_ASSERT(extra.size() == 1 && (change == Change::Slice || change == Change::Copy), "tensor names of ",
                table.family, ": ", pattern, " has a placeholder loom's ", row.loom, " lacks but is no slice or copy");
    for (int64_t v = 0, n = count_of(table, extra[0], model); v < n; ++v) {
      Values with = values;
      with[extra[0]] = v;
      out.push_back({substitute(pattern, with, &model), {loom}, &row, change, v});
    }
    return;
  }
  const std::string name = substitute(pattern, values, &model);
  if (row.how.part.index > 0) {  // a later part of a fused tensor: joins the first
    for (size_t i = first_of_group; i < out.size(); ++i) {
      if (out[i].name != name) continue;
      LOOM_ASSERT(static_cast<int>(out[i].loom.size()) == row.how.part.index, "tensor names: parts of ", name,
                  " out of order");
      out[i].loom.push_back(loom);
      return;
    }
    LOOM_ASSERT(false, "tensor names: part ", row.how.part.index, " of ", name, " before its first part");
  }
  out.push_back({name, {loom}, &row, change, 0});
}

}  // namespace

std::vector<StoredTensor> stored_tensors(const TensorTable& table, TensorFormat format, const json& model) {
  std::vector<StoredTensor> out;
  const std::vector<TensorName>& rows = table.rows;
  for (size_t begin = 0; begin < rows.size();) {
    // A run of rows with the same placeholder is expanded value by value: block by block.
    const std::vector<std::string> vars = placeholders(rows[begin].loom);
    LOOM_ASSERT(vars.size() <= 1, "tensor names of ", table.family, ": ", rows[begin].loom,
                " has more than one placeholder");
    size_t end = begin + 1;
    while (end < rows.size() && placeholders(rows[end].loom) == vars) ++end;
    const int64_t n = vars.empty() ? 1 : count_of(table, vars[0], model);
    for (int64_t v = 0; v < n; ++v) {
      Values values;
      if (!vars.empty()) values[vars[0]] = v;
      const size_t first = out.size();
      for (size_t r = begin; r < end; ++r) add_row(rows[r], format, values, table, model, first, out);
    }
    begin = end;
  }
  for (const StoredTensor& t : out) {
    LOOM_ASSERT(static_cast<int>(t.loom.size()) == t.row->how.part.count, "tensor names of ", table.family, ": ", t.name,
                " has ", t.loom.size(), " parts, its rows say ", t.row->how.part.count);
  }
  return out;
}

std::string stored_name(const TensorTable& table, TensorFormat format, const std::string& loom, const json* model) {
  for (const TensorName& row : table.rows) {
    const std::string& pattern = pattern_of(row, format);
    if (pattern.empty()) continue;
    auto values = match(row.loom, loom, model);
    if (!values) continue;
    bool bound = true;
    for (const std::string& p : placeholders(pattern)) bound = bound && values->count(p);
    if (bound) return substitute(pattern, *values, model);
  }
  LOOM_FAIL("no ", format_name(format), " name for loom's ", table.family, " tensor '", loom, "'");
}

const TensorName* row_for(const TensorTable& table, TensorFormat format, const std::string& loom, const json* model) {
  for (const TensorName& row : table.rows) {
    const std::string& pattern = pattern_of(row, format);
    if (pattern.empty()) continue;
    auto values = match(row.loom, loom, model);
    if (!values) continue;
    bool bound = true;
    for (const std::string& p : placeholders(pattern)) bound = bound && values->count(p);
    if (bound) return &row;
  }
  return nullptr;
}

std::optional<std::string> loom_name(const TensorTable& table, TensorFormat format, const std::string& stored,
                                     const json* model) {
  for (const TensorName& row : table.rows) {
    const std::string& pattern = pattern_of(row, format);
    if (pattern.empty()) continue;
    auto values = match(pattern, stored, model);
    if (!values) continue;
    bool bound = true;
    for (const std::string& p : placeholders(row.loom)) bound = bound && values->count(p);
    if (bound) return substitute(row.loom, *values, model);
  }
  return std::nullopt;
}

std::vector<std::pair<std::string, Tensor>> export_tensors(const TensorTable& table, TensorFormat format,
                                                           const LanguageModel& model) {
  std::map<std::string, Tensor> values;
  for (nn::Parameter* p : const_cast<LanguageModel&>(model).parameters()) values.emplace(p->name, p->value.detach());
  for (const auto& [name, t] : model.state_tensors()) values.emplace(name, t);
  const json& config = model.model_config().json();
  std::set<std::string> covered;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const StoredTensor& t : stored_tensors(table, format, config)) {
    const Conversion& how = t.row->how;
    std::vector<Tensor> parts;
    for (const std::string& n : t.loom) {
      if (auto it = values.find(n); it != values.end()) {
        parts.push_back(it->second);
      } else if (const std::string weight = n.substr(0, n.rfind('.')) + ".weight";
                 how.zeros_if_absent && n.ends_with(".bias") && values.count(weight)) {
        parts.push_back(Tensor::zeros({values.at(weight).size(0)}));
      }
    }
    if (parts.empty()) continue;  // the model has no such tensor (a tied GPT-2 head, a dense layer's experts)
    LOOM_ASSERT(parts.size() == t.loom.size(), table.family, " export: ", t.name, " has only some of its parts");
    Tensor v = parts.size() == 1 ? parts[0] : stacked(parts);
    if (t.change == Change::Slice) {
      v = v.slice(t.index, 1).clone().view(Shape(v.shape().begin() + 1, v.shape().end()));
    } else {
      v = convert(t.change, v, t, config, /*to_stored=*/true);
    }
    covered.insert(t.loom.begin(), t.loom.end());
    if (format == TensorFormat::Gguf && how.tied_to && values.count(how.tied_to)) {
      const Tensor& tie = values.at(how.tied_to);
      if (v.shape() == tie.shape() && std::memcmp(v.data<float>(), tie.data<float>(), v.nbytes()) == 0) continue;
    }
    out.emplace_back(t.name, v);
  }
  for (const auto& [name, v] : values) {
    LOOM_CHECK(covered.count(name), table.family, " ", format_name(format), " export: no ", format_name(format),
               " name for loom's '", name, "'");
  }
  return out;
}

// ---- import ----------------------------------------------------------------------------------------------

TensorImport::TensorImport(const TensorTable& table, TensorFormat format, LanguageModel& model,
                           TensorImportOptions options)
    : table_(table), format_(format), model_(model), options_(std::move(options)) {
  std::map<std::string, Shape> shapes;
  for (nn::Parameter* p : model.parameters()) shapes.emplace(p->name, p->value.shape());
  for (const auto& [name, t] : model.state_tensors()) {
    shapes.emplace(name, t.shape());
    state_.insert(name);
  }
  for (StoredTensor& t : stored_tensors(table, format, model.model_config().json())) {
    std::vector<Shape> have;
    for (const std::string& n : t.loom) {
      if (shapes.count(n)) have.push_back(shapes.at(n));
    }
    Expected e{t};
    if (have.size() == t.loom.size()) {
      e.present = true;
      e.shape = stored_shape(t, have);
    } else if (have.empty() && t.row->how.tied_to && shapes.count(t.row->how.tied_to)) {
      e.shape = shapes.at(t.row->how.tied_to);  // the model ties it: a stored one must equal its tie
    } else {
      LOOM_ASSERT(have.empty(), table.family, " import: the model has only some parts of ", t.name);
      continue;  // the model has no such tensor
    }
    LOOM_ASSERT(by_name_.emplace(t.name, expected_.size()).second, table.family, ": two rows store ", t.name);
    expected_.push_back(std::move(e));
  }
}

bool TensorImport::ignored(const std::string& name) const {
  auto matches = [&](const std::string& n) {
    for (const std::string& p : options_.ignored) {
      if (glob_match(p, n)) return true;
    }
    if (format_ != TensorFormat::Hf) return false;
    for (const std::string& p : table_.hf_ignored) {
      if (glob_match(p, n)) return true;
    }
    return false;
  };
  const std::string& prefix = format_ == TensorFormat::Hf ? table_.hf_optional_prefix : "";
  return matches(name) || (!prefix.empty() && !name.starts_with(prefix) && matches(prefix + name));
}

const StoredTensor* TensorImport::find(const std::string& name) const {
  auto it = by_name_.find(name);
  const std::string& prefix = format_ == TensorFormat::Hf ? table_.hf_optional_prefix : "";
  if (it == by_name_.end() && !prefix.empty() && !name.starts_with(prefix)) it = by_name_.find(prefix + name);
  return it == by_name_.end() ? nullptr : &expected_[it->second].tensor;
}

TensorImport::Expected& TensorImport::expected(const StoredTensor& t) { return expected_[by_name_.at(t.name)]; }

const Shape& TensorImport::shape(const StoredTensor& t) const { return expected_[by_name_.at(t.name)].shape; }

void TensorImport::put(const std::string& loom, const Tensor& value) {
  if (state_.count(loom)) {
    model_.load_state(loom, value);
  } else {
    model_.load_parameter(loom, value);
  }
}

void TensorImport::load(const StoredTensor& t, const Tensor& stored, const std::string& where) {
  Expected& e = expected(t);
  // One tensor under two names (GPT-2's "wte.weight" and "transformer.wte.weight").
  LOOM_CHECK(!e.loaded, where, ": '", t.name, "' appears twice");
  e.loaded = true;
  if (!e.present || t.change == Change::Copy) {
    duplicates_.emplace_back(by_name_.at(t.name), stored);
    return;
  }
  if (t.change == Change::Slice) {
    auto [slot, fresh] = slices_.try_emplace(t.loom[0]);
    if (fresh) slot->second = Tensor::zeros(model_.parameter(t.loom[0]).value.shape());
    const size_t n = static_cast<size_t>(stored.numel());
    std::memcpy(slot->second.data<float>() + t.index * static_cast<int64_t>(n), stored.data<float>(),
                n * sizeof(float));
    return;
  }
  const bool rope = t.change == Change::RopeToRotateHalf || t.change == Change::RopeToInterleaved;
  const Tensor v = rope && options_.rope_rows_as_stored
                       ? stored
                       : convert(t.change, stored, t, model_.model_config().json(), /*to_stored=*/false);
  if (t.loom.size() == 1) return put(t.loom[0], v);
  int64_t at = 0;  // fused: each part is the next rows
  for (const std::string& part : t.loom) {
    const int64_t rows = model_.parameter(part).value.size(0);
    put(part, v.slice(at, rows).clone());
    at += rows;
  }
}

bool TensorImport::held_elsewhere(const StoredTensor& t) const {
  if (options_.held_elsewhere.empty() || t.loom.empty()) return false;
  return std::all_of(t.loom.begin(), t.loom.end(), [&](const std::string& n) { return options_.held_elsewhere.count(n) > 0; });
}

void TensorImport::mark_held(const StoredTensor& t, const std::string& where) {
  Expected& e = expected(t);
  LOOM_CHECK(!e.loaded, where, ": '", t.name, "' appears twice");
  e.loaded = true;
}

Tensor TensorImport::destination(const StoredTensor& t) const {
  const Expected& e = expected_[by_name_.at(t.name)];
  if (!e.present || t.change != Change::None || t.loom.size() != 1 || state_.count(t.loom[0])) return Tensor();
  const nn::Parameter& p = model_.parameter(t.loom[0]);
  if (p.dist || p.value.dtype() != DType::F32 || !p.value.device().is_cpu() || p.value.shape() != e.shape) return Tensor();
  return p.value;
}

void TensorImport::finish(const std::string& where, std::vector<std::string>& notes) {
  for (const auto& [loom, v] : slices_) put(loom, v);
  auto value_of = [&](const std::string& loom) -> Tensor {
    for (const auto& [name, t] : model_.state_tensors()) {
      if (name == loom) return t;
    }
    return model_.parameter(loom).value;
  };
  for (Expected& e : expected_) {
    if (e.loaded || !e.present || held_elsewhere(e.tensor)) continue;
    const Conversion& how = e.tensor.row->how;
    if (how.tied_to) {
      // A tied head in a model that holds its own: loom's head becomes a copy, the same logits.
      const Expected* tie = nullptr;
      for (const Expected& o : expected_) {
        if (o.loaded && o.present && o.tensor.change != Change::Copy && o.tensor.loom.size() == 1 &&
            o.tensor.loom[0] == how.tied_to) {
          tie = &o;
          break;
        }
      }
      if (tie) {
        put(e.tensor.loom[0], value_of(how.tied_to).clone());
        notes.push_back(str("no '", e.tensor.name, "': tied to '", tie->tensor.name, "', copied into loom's untied ",
                            e.tensor.loom[0]));
        continue;
      }
    }
    if (how.if_absent) {
      notes.push_back(str("no '", e.tensor.name, "': ", how.if_absent));
      continue;
    }
    std::string loom;
    for (const std::string& n : e.tensor.loom) loom += (loom.empty() ? "" : ", ") + n;
    LOOM_FAIL(where, ": no tensor '", e.tensor.name, "' (loom's ", loom, ")");
  }
  for (const auto& [i, v] : duplicates_) {
    // Loom keeps one tensor where the file has two (a tied head, the MTP layers' copies of the head):
    // copies that differ would compute something loom cannot.
    const Expected& e = expected_[i];
    const std::string of = e.present ? e.tensor.loom[0] : e.tensor.row->how.tied_to;
    LOOM_CHECK(same_values(v, value_of(of)), where, ": '", e.tensor.name, "' differs from loom's ", of,
               ", which it must equal (loom keeps one tensor for both)");
  }
}

Tensor reorder_rope_rows(const Tensor& w, const RopeRows& r, bool to_interleaved) {
  LOOM_CHECK(w.dtype() == DType::F32 && w.shape().ndim() == 2 && r.heads > 0 && r.rope % 2 == 0 &&
                 w.shape()[0] == r.heads * (r.nope + r.rope),
             "RoPE row reordering: expected f32 [", r.heads, " heads * (", r.nope, " + ", r.rope,
             " rows, even), C], got ", dtype_name(w.dtype()), " ", w.shape());
  const int64_t C = w.shape()[1];
  Tensor out = w.clone();
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t h = 0; h < r.heads; ++h) {
    const int64_t base = h * (r.nope + r.rope) + r.nope;
    for (int64_t i = 0; i < r.rope / 2; ++i) {
      for (int64_t half = 0; half < 2; ++half) {
        // rotate-half: pair i is rows (i, i + rope/2); interleaved: rows (2i, 2i+1).
        const int64_t rotate_half = base + half * (r.rope / 2) + i, interleaved = base + 2 * i + half;
        const int64_t from = to_interleaved ? rotate_half : interleaved;
        const int64_t to = to_interleaved ? interleaved : rotate_half;
        std::memcpy(dst + to * C, src + from * C, static_cast<size_t>(C) * sizeof(float));
      }
    }
  }
  return out;
}

}  // namespace loom::models
