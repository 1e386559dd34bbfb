#include "train/sft_data.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "generate/text.h"
#include "io/json.h"

namespace loom::train {
using nlohmann::json;

SftRenderer SftRenderer::for_model(const tokenizer::Tokenizer& tok, const std::string& chat_template,
                                   std::optional<tokenizer::TokenId> eos) {
  SftRenderer r;
  r.eos = generate::default_stop_token(tok, eos);
  if (chat_template.empty()) {
    r.format = SftFormat::Raw;
    LOOM_CHECK(r.eos >= 0, "fine-tuning data: the model has no chat template and its tokenizer no end token "
               "(<|endoftext|>): a completion would have no end to learn");
    return r;
  }
  const generate::ChatTemplate t = generate::ChatTemplate::from_jinja(chat_template);
  r.format = SftFormat::ChatMl;
  r.default_system = t.default_system;
  auto control = [&](const char* text) {
    auto id = tok.special_token_id(text);
    LOOM_CHECK(id.has_value(), "fine-tuning data: the chat template is ChatML but the tokenizer has no control token ",
               text);
    return static_cast<int32_t>(*id);
  };
  r.im_start = control(generate::kChatMlStart);
  r.im_end = control(generate::kChatMlEnd);
  return r;
}

int64_t SftExample::trained_tokens() const {
  return std::count(trained.begin(), trained.end(), uint8_t{1});
}

namespace {

struct Message {
  std::string role, content;
};

const std::string& string_field(const json& obj, const std::string& key, const std::string& field,
                                const std::string& where) {
  LOOM_CHECK(obj.contains(key), where, ": ", field, " is missing");
  LOOM_CHECK(obj.at(key).is_string(), where, ": ", field, " must be a string, got ", io::brief_json(obj.at(key)));
  return obj.at(key).get_ref<const std::string&>();
}

std::vector<Message> messages_of(const json& line, const std::string& where) {
  LOOM_CHECK(line.is_object(), where, ": a line must be a JSON object with \"messages\", or \"prompt\" and "
             "\"completion\", got ", io::brief_json(line));
  std::vector<Message> out;
  if (line.contains("messages")) {
    const json& ms = line.at("messages");
    LOOM_CHECK(ms.is_array() && !ms.empty(), where, ": messages must be a non-empty array, got ", io::brief_json(ms));
    for (size_t i = 0; i < ms.size(); ++i) {
      const std::string field = "messages[" + std::to_string(i) + "]";
      LOOM_CHECK(ms[i].is_object(), where, ": ", field, " must be an object with \"role\" and \"content\", got ",
                 io::brief_json(ms[i]));
      Message m{string_field(ms[i], "role", field + ".role", where),
                string_field(ms[i], "content", field + ".content", where)};
      LOOM_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", where, ": ", field,
                 ".role must be \"system\", \"user\" or \"assistant\", got \"", io::brief_text(m.role), "\"");
      out.push_back(std::move(m));
    }
  } else {
    LOOM_CHECK(line.contains("prompt") || line.contains("completion"), where,
               ": a line needs \"messages\", or \"prompt\" and \"completion\"; it has none of them");
    out.push_back({"user", string_field(line, "prompt", "prompt", where)});
    out.push_back({"assistant", string_field(line, "completion", "completion", where)});
  }
  LOOM_CHECK(std::any_of(out.begin(), out.end(), [](const Message& m) { return m.role == "assistant"; }), where,
             ": no assistant message: nothing to learn from this line");
  return out;
}

// Appends the tokens of `header` + `content` encoded together (as one text between control tokens), marking
// as trained (when `train`) those that lie wholly inside `content`. Returns the index of the first of them.
size_t append_text(SftExample& ex, const tokenizer::Tokenizer& tok, const std::string& header,
                   const std::string& content, bool train) {
  size_t offset = 0, first_content = std::string::npos;
  for (auto id : tok.encode_ordinary(header + content)) {
    const bool in_content = offset >= header.size();
    if (in_content && first_content == std::string::npos) first_content = ex.ids.size();
    ex.ids.push_back(static_cast<int32_t>(id));
    ex.trained.push_back(train && in_content ? 1 : 0);
    offset += tok.token_bytes(id).size();
  }
  return first_content == std::string::npos ? ex.ids.size() : first_content;
}

void append_id(SftExample& ex, int32_t id, bool train) {
  ex.ids.push_back(id);
  ex.trained.push_back(train ? 1 : 0);
}

}  // namespace

SftExample render_sft_line(const json& line, const SftRenderer& r, const tokenizer::Tokenizer& tok,
                           const std::string& where) {
  const std::vector<Message> messages = messages_of(line, where);
  SftExample ex;
  size_t last_assistant = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role == "assistant") last_assistant = i;
  }
  if (r.format == SftFormat::Raw) {
    LOOM_CHECK(line.contains("prompt"), where, ": \"messages\" need a chat template, and the model has none; "
               "write the line as {\"prompt\", \"completion\"}");
    append_text(ex, tok, "", messages[0].content, false);
    ex.prompt = ex.ids;
    append_text(ex, tok, "", messages[1].content, true);
    append_id(ex, r.eos, true);
    ex.reference = messages[1].content;
    return ex;
  }
  if (r.default_system && messages[0].role != "system") {
    append_id(ex, r.im_start, false);
    append_text(ex, tok, "system\n" + *r.default_system, "", false);
    append_id(ex, r.im_end, false);
    append_text(ex, tok, "\n", "", false);
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const bool assistant = m.role == "assistant";
    append_id(ex, r.im_start, false);
    const size_t content_start = append_text(ex, tok, m.role + "\n", m.content, assistant);
    if (i == last_assistant) {
      ex.prompt.assign(ex.ids.begin(), ex.ids.begin() + static_cast<std::ptrdiff_t>(content_start));
      ex.reference = m.content;
    }
    append_id(ex, r.im_end, assistant);
    append_text(ex, tok, "\n", "", false);
  }
  return ex;
}

std::vector<SftExample> read_sft_file(const std::string& path, const SftRenderer& r, const tokenizer::Tokenizer& tok,
                                      int64_t context_length) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in.good(), "fine-tuning data: cannot open ", path);
  std::vector<SftExample> out;
  std::string text;
  for (int64_t number = 1; std::getline(in, text); ++number) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    const json line = io::try_parse_json(text);
    LOOM_CHECK(!line.is_discarded(), where, ": not valid JSON: ", io::brief_text(text));
    SftExample ex = render_sft_line(line, r, tok, where);
    ex.line = number;
    const int64_t n = static_cast<int64_t>(ex.ids.size()) - 1;
    LOOM_CHECK(n <= context_length, where, ": the example is ", n + 1, " tokens (", n,
               " positions to train), more than the model's context length of ", context_length);
    LOOM_CHECK(std::find(ex.trained.begin() + 1, ex.trained.end(), uint8_t{1}) != ex.trained.end(), where,
               ": the assistant's reply renders to no token to train on");
    out.push_back(std::move(ex));
  }
  LOOM_CHECK(!out.empty(), "fine-tuning data: ", path, " holds no example");
  return out;
}

namespace {
// A permutation of 0..n-1 drawn from `key` (Fisher-Yates with unbiased draws): the same on any machine.
std::vector<int64_t> permutation(int64_t n, RngKey key) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(data::uniform_below(key, static_cast<uint64_t>(i), static_cast<uint64_t>(i + 1)));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}
}  // namespace

SftSplit split_sft(std::vector<SftExample> examples, double fraction, RngKey key) {
  LOOM_CHECK(fraction >= 0 && fraction < 1, "fine-tuning data: the held-out fraction must be in [0, 1), got ", fraction);
  const auto n = static_cast<int64_t>(examples.size());
  int64_t held = static_cast<int64_t>(std::llround(fraction * static_cast<double>(n)));
  if (fraction > 0 && n > 1) held = std::clamp<int64_t>(held, 1, n - 1);
  std::vector<uint8_t> is_held(static_cast<size_t>(n), 0);
  const std::vector<int64_t> p = permutation(n, key);
  for (int64_t i = n - held; i < n; ++i) is_held[static_cast<size_t>(p[static_cast<size_t>(i)])] = 1;
  SftSplit s;
  for (int64_t i = 0; i < n; ++i) (is_held[static_cast<size_t>(i)] ? s.held_out : s.train).push_back(std::move(examples[static_cast<size_t>(i)]));
  return s;
}

data::Batch sft_batch(const std::vector<const SftExample*>& examples, int32_t pad) {
  LOOM_CHECK(!examples.empty(), "sft_batch: no example");
  int64_t T = 0;
  for (const SftExample* e : examples) T = std::max<int64_t>(T, static_cast<int64_t>(e->ids.size()) - 1);
  const auto B = static_cast<int64_t>(examples.size());
  data::Batch b;
  b.inputs = Tensor::empty({B, T}, DType::I32);
  b.targets = Tensor::empty({B, T}, DType::I32);
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  for (int64_t row = 0; row < B; ++row) {
    const SftExample& e = *examples[static_cast<size_t>(row)];
    const auto n = static_cast<int64_t>(e.ids.size()) - 1;
    for (int64_t t = 0; t < T; ++t) {
      const bool real = t < n;
      in[row * T + t] = real ? e.ids[static_cast<size_t>(t)] : pad;
      tg[row * T + t] = real && e.trained[static_cast<size_t>(t + 1)] ? e.ids[static_cast<size_t>(t + 1)] : kIgnoreTarget;
    }
  }
  return b;
}

data::Batch sft_packed_batch(const std::vector<const SftExample*>& examples, int64_t row_length, int32_t pad) {
  LOOM_CHECK(!examples.empty(), "sft_packed_batch: no example");
  LOOM_CHECK(row_length > 0, "sft_packed_batch: the row length must be positive, got ", row_length);
  // First fit, in order: row_of[e] and the example's first position in its row.
  std::vector<int64_t> fill;  // positions used per row
  std::vector<std::pair<int64_t, int64_t>> place;
  for (const SftExample* e : examples) {
    const auto n = static_cast<int64_t>(e->ids.size()) - 1;
    LOOM_CHECK(n >= 1 && n <= row_length, "sft_packed_batch: an example of ", n,
               " positions does not fit a packed row of ", row_length, " (line ", e->line, ")");
    size_t r = 0;
    while (r < fill.size() && fill[r] + n > row_length) ++r;
    if (r == fill.size()) fill.push_back(0);
    place.emplace_back(static_cast<int64_t>(r), fill[r]);
    fill[r] += n;
  }
  const auto R = static_cast<int64_t>(fill.size());
  const int64_t T = *std::max_element(fill.begin(), fill.end());
  data::Batch b{Tensor::empty({R, T}, DType::I32), Tensor::empty({R, T}, DType::I32),
                Tensor::empty({R, T}, DType::I32), Tensor::empty({R, T}, DType::I32)};
  int32_t* in = b.inputs.data<int32_t>();
  int32_t* tg = b.targets.data<int32_t>();
  int32_t* pos = b.positions.data<int32_t>();
  int32_t* kb = b.key_begin.data<int32_t>();
  // Padding first: each row's tail [fill, T) is one document of its own.
  for (int64_t r = 0; r < R; ++r) {
    const int64_t f = fill[static_cast<size_t>(r)];
    for (int64_t t = f; t < T; ++t) {
      in[r * T + t] = pad;
      tg[r * T + t] = kIgnoreTarget;
      pos[r * T + t] = static_cast<int32_t>(t - f);
      kb[r * T + t] = static_cast<int32_t>(f);
    }
  }
  for (size_t i = 0; i < examples.size(); ++i) {
    const SftExample& e = *examples[i];
    const auto [r, start] = place[i];
    const auto n = static_cast<int64_t>(e.ids.size()) - 1;
    for (int64_t t = 0; t < n; ++t) {
      const int64_t at = r * T + start + t;
      in[at] = e.ids[static_cast<size_t>(t)];
      tg[at] = e.trained[static_cast<size_t>(t + 1)] ? e.ids[static_cast<size_t>(t + 1)] : kIgnoreTarget;
      pos[at] = static_cast<int32_t>(t);
      kb[at] = static_cast<int32_t>(start);
    }
  }
  return b;
}

SftLoader::SftLoader(const std::vector<SftExample>& examples, int64_t batch_size, RngKey key, int64_t pack_length)
    : examples_(examples), batch_size_(batch_size), key_(key), pack_length_(pack_length) {
  LOOM_CHECK(!examples.empty(), "fine-tuning: no training example");
  LOOM_CHECK(batch_size > 0, "fine-tuning: the batch size must be positive, got ", batch_size);
  LOOM_CHECK(pack_length >= 0, "fine-tuning: the packed row length must be >= 0, got ", pack_length);
  order_ = order(0);
}

std::vector<int64_t> SftLoader::order(int64_t epoch) const {
  return permutation(static_cast<int64_t>(examples_.size()), key_.fold_in(static_cast<uint64_t>(epoch)));
}

data::Batch SftLoader::next() {
  const auto n = static_cast<int64_t>(examples_.size());
  if (state_.position >= n) {
    ++state_.epoch;
    state_.position = 0;
    order_ = order(state_.epoch);
  }
  std::vector<const SftExample*> rows;
  for (; state_.position < n && static_cast<int64_t>(rows.size()) < batch_size_; ++state_.position) {
    rows.push_back(&examples_[static_cast<size_t>(order_[static_cast<size_t>(state_.position)])]);
  }
  return pack_length_ > 0 ? sft_packed_batch(rows, pack_length_) : sft_batch(rows);
}

void SftLoader::restore(const State& s) {
  LOOM_CHECK(s.epoch >= 0 && s.position >= 0 && s.position <= static_cast<int64_t>(examples_.size()),
             "fine-tuning: loader state (epoch ", s.epoch, ", position ", s.position, ") does not fit ",
             examples_.size(), " examples");
  state_ = s;
  order_ = order(s.epoch);
}

SftLoader::State SftLoader::state_from_json(const json& j) {
  return {j.at("epoch").get<int64_t>(), j.at("position").get<int64_t>()};
}

std::vector<data::Batch> sft_fixed_batches(const std::vector<SftExample>& examples, int64_t batch_size,
                                           int64_t pack_length) {
  std::vector<data::Batch> out;
  for (size_t i = 0; i < examples.size(); i += static_cast<size_t>(batch_size)) {
    std::vector<const SftExample*> rows;
    for (size_t j = i; j < std::min(examples.size(), i + static_cast<size_t>(batch_size)); ++j) rows.push_back(&examples[j]);
    out.push_back(pack_length > 0 ? sft_packed_batch(rows, pack_length) : sft_batch(rows));
  }
  return out;
}

}  // namespace loom::train
