#include "train/finetune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/autograd.h"
#include "core/parallel.h"
#include "core/thread_count.h"
#include "io/file.h"
#include "io/json.h"
#include "io/json_checked.h"
#include "io/safetensors.h"
#include "models/gguf.h"
#include "ops/elementwise.h"
#include "runs/checkpoint.h"
#include "runs/load.h"
#include "tokenizer/formats.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/progress.h"

namespace loom::train {
namespace fs = std::filesystem;
using nlohmann::json;

// ---- configuration ---------------------------------------------------------------------------------

namespace {
// lora.targets is one string, "q_proj,v_proj": what --lora-targets and --set take.
std::string join_targets(const std::vector<std::string>& targets) {
  std::string out;
  for (const auto& t : targets) out += (out.empty() ? "" : ",") + t;
  return out;
}
std::vector<std::string> split_targets(const std::string& text) {
  std::vector<std::string> out;
  for (size_t start = 0; start <= text.size();) {
    const size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}
}  // namespace

const std::vector<io::KeyRelation>& FinetuneConfig::relations() {
  static const std::vector<io::KeyRelation> r = {
      {io::Relation::AtMost, "optimizer.min_lr", "optimizer.lr", " (the cosine decays from lr to min_lr)"},
  };
  return r;
}

json FinetuneConfig::to_json() const {
  return json{
      {"base", {{"weights", weights}, {"context_length", context_length}, {"quantized", quantized}}},
      {"data", {{"train", data}, {"val", val_data}, {"val_fraction", val_fraction}, {"packing", packing}}},
      {"lora",
       {{"full", full},
        {"rank", adapter.lora.rank},
        {"alpha", io::float_for_json(adapter.lora.alpha)},
        {"dropout", io::float_for_json(adapter.lora.dropout)},
        {"targets", join_targets(adapter.targets)}}},
      {"optimizer",
       {{"lr", lr},
        {"min_lr", min_lr},
        {"beta1", beta1},
        {"beta2", beta2},
        {"eps", eps},
        {"weight_decay", weight_decay},
        {"grad_clip", grad_clip},
        {"warmup_steps", warmup_steps}}},
      {"training",
       {{"max_steps", max_steps},
        {"batch_size", batch_size},
        {"grad_accum_steps", grad_accum_steps},
        {"seed", seed},
        {"threads", threads},
        {"precision", precision},
        {"recompute", recompute}}},
      {"eval", {{"interval", eval_interval}, {"exact_match", exact_match}, {"max_new_tokens", max_new_tokens}}},
      {"checkpoint", {{"interval", checkpoint_interval}, {"keep_last", keep_last}}},
      {"logging", {{"interval", log_interval}, {"progress", progress}}},
  };
}

FinetuneConfig FinetuneConfig::from_json(const json& j) {
  json m = FinetuneConfig{}.to_json();
  if (!j.is_null()) io::merge_checked(m, j, "");
  FinetuneConfig c;
  c.weights = m["base"]["weights"].get<std::string>();
  c.context_length = m["base"]["context_length"].get<int64_t>();
  c.quantized = m["base"]["quantized"].get<bool>();
  c.data = m["data"]["train"].get<std::string>();
  c.val_data = m["data"]["val"].get<std::string>();
  c.val_fraction = m["data"]["val_fraction"].get<double>();
  c.packing = m["data"]["packing"].get<bool>();
  const json& l = m["lora"];
  c.full = l["full"].get<bool>();
  c.adapter.lora.rank = l["rank"].get<int64_t>();
  c.adapter.lora.alpha = l["alpha"].get<float>();
  c.adapter.lora.dropout = l["dropout"].get<float>();
  c.adapter.targets = split_targets(l["targets"].get<std::string>());
  const json& o = m["optimizer"];
  c.lr = o["lr"].get<double>();
  c.min_lr = o["min_lr"].get<double>();
  c.beta1 = o["beta1"].get<double>();
  c.beta2 = o["beta2"].get<double>();
  c.eps = o["eps"].get<double>();
  c.weight_decay = o["weight_decay"].get<double>();
  c.grad_clip = o["grad_clip"].get<double>();
  c.warmup_steps = o["warmup_steps"].get<int64_t>();
  const json& t = m["training"];
  c.max_steps = t["max_steps"].get<int64_t>();
  c.batch_size = t["batch_size"].get<int64_t>();
  c.grad_accum_steps = t["grad_accum_steps"].get<int64_t>();
  c.seed = t["seed"].get<uint64_t>();
  c.threads = t["threads"].get<int64_t>();
  c.precision = t["precision"].get<std::string>();
  c.recompute = t["recompute"].get<std::string>();
  c.eval_interval = m["eval"]["interval"].get<int64_t>();
  c.exact_match = m["eval"]["exact_match"].get<int64_t>();
  c.max_new_tokens = m["eval"]["max_new_tokens"].get<int64_t>();
  c.checkpoint_interval = m["checkpoint"]["interval"].get<int64_t>();
  c.keep_last = m["checkpoint"]["keep_last"].get<int64_t>();
  c.log_interval = m["logging"]["interval"].get<int64_t>();
  c.progress = m["logging"]["progress"].get<std::string>();
  c.validate();
  return c;
}

FinetuneConfig FinetuneConfig::with_overrides(const json& j, const std::vector<std::string>& sets) {
  json m = FinetuneConfig{}.to_json();
  if (!j.is_null()) io::merge_checked(m, j, "");
  for (const std::string& s : sets) {
    auto [path, value] = parse_override(s);
    std::vector<std::string> parts;
    for (size_t start = 0;;) {
      const size_t dot = path.find('.', start);
      parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    // A string key takes the text as written (--set data.train=123.jsonl).
    const json* slot = &m;
    for (const auto& p : parts) slot = slot && slot->is_object() && slot->contains(p) ? &(*slot)[p] : nullptr;
    if (slot && slot->is_string() && !value.is_string()) value = s.substr(s.find('=') + 1);
    json overlay = value;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) overlay = json{{*it, overlay}};
    io::merge_checked(m, overlay, "");
  }
  return from_json(m);
}

void FinetuneConfig::validate() const {
  auto positive = [](int64_t v, const char* key) { LOOM_CHECK(v > 0, "config: ", key, " must be positive, got ", v); };
  auto non_negative = [](double v, const char* key) { LOOM_CHECK(v >= 0, "config: ", key, " must be >= 0, got ", v); };
  LOOM_CHECK(!weights.empty(), "config: base.weights must name the model to fine-tune (--weights)");
  LOOM_CHECK(!data.empty(), "config: data.train must name a JSON Lines file (--data)");
  LOOM_CHECK(val_fraction >= 0 && val_fraction < 1, "config: data.val_fraction must be in [0, 1), got ", val_fraction);
  non_negative(static_cast<double>(context_length), "base.context_length");
  models::recompute_from_name(recompute);  // "none", "full" or "selective", else an error naming it
  LOOM_CHECK(!(quantized && full), "config: base.quantized keeps the base's matrices quantized and frozen, so it "
             "takes LoRA adapters only, not lora.full");
  if (!full) {
    LOOM_CHECK(adapter.lora.rank > 0, "config: lora.rank must be positive, got ", adapter.lora.rank);
    LOOM_CHECK(adapter.lora.alpha > 0, "config: lora.alpha must be positive, got ", adapter.lora.alpha);
    LOOM_CHECK(adapter.lora.dropout >= 0 && adapter.lora.dropout < 1, "config: lora.dropout must be in [0, 1), got ",
               adapter.lora.dropout);
    LOOM_CHECK(!adapter.targets.empty(), "config: lora.targets must name at least one layer (q_proj, v_proj, ...; all-linear)");
  }
  LOOM_CHECK(std::isfinite(lr) && lr >= 0, "config: optimizer.lr must be >= 0, got ", lr);
  non_negative(min_lr, "optimizer.min_lr");
  LOOM_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "config: optimizer.beta1 and beta2 must be in [0, 1)");
  LOOM_CHECK(eps > 0, "config: optimizer.eps must be positive, got ", eps);
  non_negative(weight_decay, "optimizer.weight_decay");
  non_negative(grad_clip, "optimizer.grad_clip");
  non_negative(static_cast<double>(warmup_steps), "optimizer.warmup_steps");
  positive(max_steps, "training.max_steps");
  positive(batch_size, "training.batch_size");
  positive(grad_accum_steps, "training.grad_accum_steps");
  LOOM_CHECK(threads >= 0 && threads <= kMaxThreads, "config: training.threads must be in [0, ", kMaxThreads, "], got ", threads);
  LOOM_CHECK(precision == "f32" || precision == "bf16", "config: training.precision must be \"f32\" or \"bf16\", got \"",
             precision, "\"");
  non_negative(static_cast<double>(eval_interval), "eval.interval");
  non_negative(static_cast<double>(exact_match), "eval.exact_match");
  positive(max_new_tokens, "eval.max_new_tokens");
  non_negative(static_cast<double>(checkpoint_interval), "checkpoint.interval");
  non_negative(static_cast<double>(keep_last), "checkpoint.keep_last");
  positive(log_interval, "logging.interval");
  LOOM_CHECK(progress == "auto" || progress == "bar" || progress == "lines" || progress == "none",
             "config: logging.progress must be \"auto\", \"bar\", \"lines\" or \"none\", got \"", progress, "\"");
  io::check_relations(to_json(), relations(), "", "config: ");
}

// ---- the fine-tuner --------------------------------------------------------------------------------

namespace {

bool is_run_dir(const std::string& path) {
  return fs::is_directory(path) && fs::exists(fs::path(path) / "model.safetensors");
}

int64_t trained_targets(const data::Batch& b) {
  int64_t n = 0;
  const int32_t* t = b.targets.data<int32_t>();
  for (int64_t i = 0; i < b.targets.numel(); ++i) n += t[i] != kIgnoreTarget;
  return n;
}

// The greedy reply to `prompt`, stopping at one of `stops` (not included) or after max_new tokens. Through
// the decode cache where the family's decoding runs every layer through nn::Linear (and so its adapters);
// DeepSeek-V3's absorbed decoding multiplies weights directly, so it recomputes the whole sequence.
std::vector<int32_t> greedy_reply(const models::LanguageModel& m, std::vector<int32_t> ids, int64_t max_new,
                                  const std::set<int32_t>& stops) {
  autograd::NoGradGuard no_grad;
  const int64_t V = m.vocab_size();
  const bool cached = m.arch() != "deepseek_v3";
  std::unique_ptr<nn::DecodeCache> cache = cached ? m.make_decode_cache(1) : nullptr;
  std::vector<int32_t> reply, fresh = ids;
  auto argmax = [V](const float* row) {
    int32_t best = 0;
    for (int64_t v = 1; v < V; ++v) best = row[v] > row[best] ? static_cast<int32_t>(v) : best;
    return best;
  };
  for (int64_t i = 0; i < max_new && static_cast<int64_t>(ids.size()) < m.context_length(); ++i) {
    int32_t next;
    if (cached) {
      Tensor logits = m.decode_last(Tensor::from_vector<int32_t>({1, static_cast<int64_t>(fresh.size())}, fresh), *cache);
      next = argmax(logits.data<float>());
    } else {
      const auto T = static_cast<int64_t>(ids.size());
      Tensor logits = m.logits(Tensor::from_vector<int32_t>({1, T}, ids));
      next = argmax(logits.data<float>() + (T - 1) * V);
    }
    if (stops.count(next)) break;
    reply.push_back(next);
    ids.push_back(next);
    fresh = {next};
  }
  return reply;
}

void write_json_file(const std::string& path, const json& j) {
  const std::string text = j.dump(2) + "\n";
  io::write_file_atomically(path, [&](io::FileWriter& w) { w.write(text.data(), text.size()); });
}

}  // namespace

Finetuner::Finetuner(FinetuneConfig config, std::string run_dir, const runs::MemoryBudget& memory)
    : config_(std::move(config)), run_dir_(std::move(run_dir)) {
  config_.validate();
  if (config_.threads > 0) set_num_threads(static_cast<int>(config_.threads));
  const bool run = is_run_dir(config_.weights);
  LOOM_CHECK(!config_.quantized || config_.weights.ends_with(".gguf"), "finetune: base.quantized needs a GGUF base, got ",
             config_.weights);
  runs::LoadedRun loaded = runs::load_for_job(run ? config_.weights : "", run ? "" : config_.weights, memory,
                                              runs::model_memory, "finetune", config_.quantized,
                                              /*quantized_only=*/config_.quantized);
  LOOM_CHECK(loaded.tokenizer.has_value(), "finetune: ", config_.weights,
             " has no tokenizer (a GGUF with tokenizer metadata, an HF directory with tokenizer.json, or a loom run)");
  const runs::ChatSettings chat = runs::chat_settings(loaded, fs::is_directory(config_.weights) ? config_.weights : "");
  model_ = std::move(loaded.model);
  tokenizer_ = std::move(loaded.tokenizer);
  if (config_.quantized) {
    // The layers held quantized multiply by their tiles from now on; their f32 copies go.
    int64_t kept = 0;
    for (nn::Linear* l : models::linear_layers(*model_)) {
      if (!l->quantized) continue;
      l->dequantized_matmul = true;
      l->weight.value = Tensor::empty({0});
      l->weight.bf16_copy = Tensor();
      l->weight.value_changed();
      ++kept;
    }
    LOOM_CHECK(kept > 0, "finetune: ", config_.weights, " has no matrix in a type loom multiplies quantized (Q8_0, "
               "Q4_0, Q4_1, Q4_K, Q6_K)");
  }
  chat_template_ = chat.chat_template;
  eos_ = chat.eos;
  renderer_ = SftRenderer::for_model(*tokenizer_, chat_template_, eos_);

  const int64_t ctx = config_.context_length > 0 ? std::min(config_.context_length, model_->context_length())
                                                 : model_->context_length();
  const RngKey root = RngKey::from_seed(config_.seed);
  std::vector<SftExample> all = read_sft_file(config_.data, renderer_, *tokenizer_, ctx);
  if (config_.val_data.empty()) {
    SftSplit split = split_sft(std::move(all), config_.val_fraction, root.fold_in("held-out"));
    train_ = std::move(split.train);
    held_out_ = std::move(split.held_out);
  } else {
    train_ = std::move(all);
    held_out_ = read_sft_file(config_.val_data, renderer_, *tokenizer_, ctx);
  }
  LOOM_CHECK(!train_.empty(), "finetune: no training example is left after holding out ", held_out_.size());

  if (config_.full) {
    trained_ = model_->parameters();
    for (nn::Parameter* p : trained_) p->value.set_requires_grad(true);
  } else {
    models::attach_adapters(*model_, config_.adapter, root.fold_in("lora"));
    models::peft_adapter_tensors(*model_);  // the adapters can be saved in PEFT's names: refused now, not after training
    trained_ = models::freeze_all_but_adapters(*model_);
  }
  if (config_.precision == "bf16") {
    model_->set_matmul_precision(ops::MatmulPrecision::BF16);
    // The frozen weights' bf16 copies, made once: nothing rewrites them.
    for (nn::Parameter* p : model_->parameters()) {
      if (p->value.requires_grad() || p->value.dtype() != DType::F32 || p->value.ndim() != 2) continue;
      p->bf16_copy = p->value.to(DType::BF16);
      p->bf16_copy_current = true;
    }
  }
  optimizer_ = std::make_unique<AdamW>(
      trained_, AdamWOptions{static_cast<float>(config_.lr), static_cast<float>(config_.beta1),
                             static_cast<float>(config_.beta2), static_cast<float>(config_.eps),
                             static_cast<float>(config_.weight_decay)});
  pack_length_ = config_.packing ? ctx : 0;
  loader_ = std::make_unique<SftLoader>(train_, config_.batch_size, root.fold_in("sft-batches"), pack_length_);
}

Finetuner::~Finetuner() = default;

double Finetuner::loss_of(const data::Batch& b, const models::ForwardContext& ctx) {
  models::ForwardContext c = ctx;
  c.positions = b.positions;
  c.key_begin = b.key_begin;
  return model_->loss(b.inputs, b.targets, c).item();
}

double Finetuner::validation_loss() {
  autograd::NoGradGuard no_grad;
  double total = 0;
  int64_t tokens = 0;
  for (const data::Batch& b : sft_fixed_batches(held_out_, config_.batch_size, pack_length_)) {
    const int64_t n = trained_targets(b);
    total += loss_of(b, {}) * static_cast<double>(n);
    tokens += n;
  }
  return tokens > 0 ? total / static_cast<double>(tokens) : 0.0;
}

ExactMatch Finetuner::exact_match(int64_t limit, const StopSignal* stop) {
  // A base held quantized decodes with the integer kernels, as `loom chat` runs it: dequantizing every
  // matrix per token would cost more than the rest of the run.
  std::vector<nn::Linear*> tiled;
  for (nn::Linear* l : models::linear_layers(*model_)) {
    if (l->quantized && l->dequantized_matmul) tiled.push_back(l);
  }
  for (nn::Linear* l : tiled) l->dequantized_matmul = false;
  struct Restore {
    std::vector<nn::Linear*>& layers;
    ~Restore() {
      for (nn::Linear* l : layers) l->dequantized_matmul = true;
    }
  } restore{tiled};
  ExactMatch r;
  std::set<int32_t> stops;
  if (renderer_.im_end >= 0) stops.insert(renderer_.im_end);
  if (renderer_.eos >= 0) stops.insert(renderer_.eos);
  for (const SftExample& e : held_out_) {
    if (r.total >= limit || (stop != nullptr && stop->requested())) break;
    const auto reply = greedy_reply(*model_, e.prompt, config_.max_new_tokens, stops);
    const std::vector<tokenizer::TokenId> ids(reply.begin(), reply.end());
    // A model's vocabulary may be larger than its tokenizer's: an id past the tokenizer's is no text at all.
    const auto V = static_cast<tokenizer::TokenId>(tokenizer_->vocab_size());
    const bool text = std::all_of(ids.begin(), ids.end(), [V](tokenizer::TokenId id) { return id < V; });
    r.matched += text && tokenizer_->decode(ids) == e.reference;
    ++r.total;
  }
  return r;
}

json Finetuner::state_json() const {
  json cfg = config_.to_json();
  return json{{"format", "loom-finetune-state"},
              {"version", 1},
              {"step", step_},
              {"optimizer_steps", optimizer_->step_count()},
              {"data_loader", loader_->state_json()},
              {"identity", {{"lora", cfg["lora"]}, {"data", cfg["data"]}, {"seed", config_.seed},
                            {"batch_size", config_.batch_size}, {"grad_accum_steps", config_.grad_accum_steps},
                            {"weights", config_.weights}}},
              {"first_val_loss", first_val_loss_ ? json(*first_val_loss_) : json()},
              {"last_val_loss", last_val_loss_ ? json(*last_val_loss_) : json()},
              {"exact_match_before", exact_before_ ? json(*exact_before_) : json()}};
}

std::string Finetuner::save_checkpoint() {
  std::vector<runs::CheckpointFile> files;
  if (config_.full) {
    files.push_back({"model.safetensors", [&](const std::string& path) { runs::save_model_weights(*model_, path); }});
  } else {
    files.push_back({"adapter.safetensors", [&](const std::string& path) {
                       io::NamedTensors t;
                       for (nn::Parameter* p : trained_) t.emplace_back(p->name, p->value.detach());
                       io::write_safetensors(path, t, {{"loom.adapter", config_.to_json()["lora"].dump()}});
                     }});
  }
  files.push_back({"optimizer.safetensors", [&](const std::string& path) {
                     const int64_t count = optimizer_->step_count();
                     std::vector<io::SafetensorsEntry> entries;
                     entries.push_back({"step", io::SafetensorsDtype::I64, {}, &count, sizeof(count)});
                     for (size_t i = 0; i < trained_.size(); ++i) {
                       for (auto [suffix, t] : {std::pair<const char*, Tensor*>{".exp_avg", &optimizer_->exp_avg(i)},
                                                {".exp_avg_sq", &optimizer_->exp_avg_sq(i)}}) {
                         if (!t->defined()) continue;
                         std::vector<uint64_t> shape(t->shape().begin(), t->shape().end());
                         entries.push_back({trained_[i]->name + suffix, io::SafetensorsDtype::F32, shape, t->data<float>(),
                                            static_cast<uint64_t>(t->numel()) * sizeof(float)});
                       }
                     }
                     io::write_safetensors(path, entries, {{"loom.optimizer", "adamw"}});
                   }});
  files.push_back({"trainer_state.json", [&](const std::string& path) { write_json_file(path, state_json()); }});
  const std::string path = runs::write_checkpoint(run_dir_, step_, files);
  runs::apply_retention(run_dir_, config_.keep_last, {}, step_);
  return path;
}

void Finetuner::load_checkpoint(const std::string& dir) {
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  const json s = io::read_json_file(state_path, "fine-tuning state");
  try {
    const json ours = state_json()["identity"];
    LOOM_CHECK(s.at("identity") == ours, "checkpoint ", dir, " was written by a different fine-tuning run: it has ",
               s.at("identity").dump(), " but this config has ", ours.dump());
    const std::string weights_file = config_.full ? "model.safetensors" : "adapter.safetensors";
    const io::SafetensorsFile w = io::SafetensorsFile::open((fs::path(dir) / weights_file).string());
    if (config_.full) {
      runs::load_model_tensors(*model_, w, dir + "/model.safetensors");
    } else {
      LOOM_CHECK(w.size() == trained_.size(), dir, "/adapter.safetensors holds ", w.size(), " tensors, the adapters have ",
                 trained_.size());
      for (nn::Parameter* p : trained_) {
        const Tensor t = w.tensor(p->name);
        LOOM_CHECK(t.shape() == p->value.shape() && t.dtype() == DType::F32, dir, "/adapter.safetensors: ", p->name,
                   " is ", t.describe(), ", expected f32 ", p->value.shape());
        p->value.copy_from(t);
        p->value_changed();
      }
    }
    const io::SafetensorsFile opt = io::SafetensorsFile::open((fs::path(dir) / "optimizer.safetensors").string());
    int64_t count = 0;
    LOOM_CHECK(opt.info("step").nbytes() == 8, dir, "/optimizer.safetensors: \"step\" must be one I64");
    std::memcpy(&count, opt.bytes("step").data(), sizeof(count));
    optimizer_->set_step_count(count);
    for (size_t i = 0; i < trained_.size(); ++i) {
      const std::string m = trained_[i]->name + ".exp_avg", v = trained_[i]->name + ".exp_avg_sq";
      LOOM_CHECK(opt.contains(m) == opt.contains(v), dir, " has only one of ", m, " and ", v);
      for (auto [name, dst] : {std::pair<std::string, Tensor*>{m, &optimizer_->exp_avg(i)}, {v, &optimizer_->exp_avg_sq(i)}}) {
        if (!opt.contains(name)) {
          if (dst->defined()) dst->zero_();
          continue;
        }
        const Tensor t = opt.tensor(name);
        LOOM_CHECK(t.shape() == trained_[i]->value.shape() && t.dtype() == DType::F32, dir, "/optimizer.safetensors: ",
                   name, " is ", t.describe());
        if (dst->defined()) {
          dst->copy_from(t);
        } else {
          *dst = t.clone();
        }
      }
    }
    loader_->restore(SftLoader::state_from_json(s.at("data_loader")));
    step_ = s.at("step").get<int64_t>();
    first_val_loss_.reset();
    last_val_loss_.reset();
    exact_before_.reset();
    if (!s.at("first_val_loss").is_null()) first_val_loss_ = s.at("first_val_loss").get<double>();
    if (!s.at("last_val_loss").is_null()) last_val_loss_ = s.at("last_val_loss").get<double>();
    if (!s.at("exact_match_before").is_null()) exact_before_ = s.at("exact_match_before").get<double>();
  } catch (const json::exception& e) {
    LOOM_FAIL(state_path, ": malformed fine-tuning state: ", e.what());
  }
}

std::optional<int64_t> Finetuner::resume() {
  auto ref = runs::latest_valid_checkpoint(run_dir_);
  if (!ref) return std::nullopt;
  load_checkpoint(ref->path);
  return step_;
}

void Finetuner::save_outputs() {
  if (!config_.full) {
    models::save_peft_adapter(*model_, config_.adapter, config_.weights, (fs::path(run_dir_) / "adapter").string());
    return;
  }
  runs::save_model_weights(*model_, (fs::path(run_dir_) / "model.safetensors").string());
  tokenizer::save_hf_json(*tokenizer_, (fs::path(run_dir_) / "tokenizer.json").string());
  if (eos_ || !chat_template_.empty()) {
    models::write_tokenizer_config(run_dir_, *tokenizer_, std::nullopt, eos_, chat_template_, model_->context_length());
  }
}

FinetuneSummary Finetuner::run(const StopSignal* stop) {
  fs::create_directories(run_dir_);
  write_json_file((fs::path(run_dir_) / "config.json").string(), config_.to_json());
  MetricsWriter metrics(run_dir_, step_ > 0 ? std::optional<int64_t>(step_) : std::nullopt);
  Progress progress(config_.max_steps, progress_mode_from_name(config_.progress, stderr), stderr, step_);
  FinetuneSummary summary;
  auto validate = [&] {
    const double v = validation_loss();
    if (!first_val_loss_) first_val_loss_ = v;
    last_val_loss_ = v;
    ValEvent e{step_, v};
    metrics.val(e);
    progress.log_val(e);
  };
  auto exact = [&](const char* when) {
    const ExactMatch m = exact_match(config_.exact_match, stop);
    metrics.write({{"event", "exact_match"}, {"step", step_}, {"when", when}, {"matched", m.matched}, {"total", m.total},
                   {"fraction", m.fraction()}});
    progress.note(str("exact match ", when, ": ", m.matched, " / ", m.total, " (", m.fraction() * 100, "%)"));
    summary.exact_match_examples = m.total;
    return m.fraction();
  };
  const bool evaluate = !held_out_.empty();
  if (step_ == 0 && evaluate) {
    if (config_.eval_interval > 0) validate();
    if (config_.exact_match > 0) exact_before_ = exact("before");
  }
  const RngKey dropout_root = RngKey::from_seed(config_.seed).fold_in("dropout");
  const models::Recompute recompute = models::recompute_from_name(config_.recompute);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int64_t run_tokens = 0, window_tokens = 0;
  auto window_start = start;
  double loss_value = 0;
  while (step_ < config_.max_steps && !(stop && stop->requested())) {
    if (stop) stop->set_step(step_ + 1);
    const float lr = cosine_lr(step_, static_cast<float>(config_.lr), static_cast<float>(config_.min_lr),
                               config_.warmup_steps, config_.max_steps);
    optimizer_->zero_grad();
    model_->begin_training_step();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < config_.grad_accum_steps; ++micro) {
      const data::Batch batch = loader_->next();
      const RngKey key = dropout_root.fold_in(static_cast<uint64_t>(step_)).fold_in(static_cast<uint64_t>(micro));
      nn::LoraDropoutScope scope(key.fold_in("lora"));
      models::ForwardContext ctx = models::ForwardContext::train(key, recompute);
      ctx.positions = batch.positions;  // packed rows (data.packing), else undefined
      ctx.key_begin = batch.key_begin;
      Tensor loss = model_->loss(batch.inputs, batch.targets, ctx);
      loss_sum += loss.item();
      window_tokens += trained_targets(batch);
      const Tensor scaled = config_.grad_accum_steps > 1
                                ? ops::scale(loss, 1.0f / static_cast<float>(config_.grad_accum_steps)) : loss;
      scaled.backward();
    }
    loss_value = loss_sum / static_cast<double>(config_.grad_accum_steps);
    std::vector<Tensor> grads = gradients_of(trained_);
    const double norm = config_.grad_clip > 0 ? clip_grad_norm(grads, config_.grad_clip) : global_grad_norm(grads);
    const bool finite = std::isfinite(loss_value) && std::isfinite(norm);
    if (finite) optimizer_->step(lr);
    // Model state that training moves besides the weights (DeepSeek-V3's routing biases) is part of the
    // base: LoRA leaves it frozen, as the weights (the adapters' checkpoints and PEFT's files hold no
    // other tensor); full fine-tuning updates it and checkpoints it with the weights.
    model_->end_training_step(finite && config_.full);
    ++step_;
    progress.update(step_);
    if (step_ % config_.log_interval == 0 || step_ == config_.max_steps) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      TrainEvent e{step_, loss_value, lr, norm, secs > 0 ? static_cast<double>(window_tokens) / secs : 0.0, 0.0,
                   model_->take_training_metrics()};
      metrics.train(e);
      progress.log(e);
      run_tokens += window_tokens;
      window_tokens = 0;
      window_start = Clock::now();
    }
    if (evaluate && config_.eval_interval > 0 && (step_ % config_.eval_interval == 0 || step_ == config_.max_steps)) {
      validate();
    }
    if (config_.checkpoint_interval > 0 && (step_ % config_.checkpoint_interval == 0 || step_ == config_.max_steps)) {
      save_checkpoint();
    }
  }
  run_tokens += window_tokens;
  summary.stopped_early = step_ < config_.max_steps;
  if (summary.stopped_early && config_.checkpoint_interval > 0) save_checkpoint();
  summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  summary.tokens_per_s = summary.seconds > 0 ? static_cast<double>(run_tokens) / summary.seconds : 0.0;
  if (!summary.stopped_early && evaluate && config_.exact_match > 0) summary.exact_match_after = exact("after");
  progress.finish();
  summary.steps_completed = step_;
  summary.last_loss = loss_value;
  summary.first_val_loss = first_val_loss_;
  summary.last_val_loss = last_val_loss_;
  summary.exact_match_before = exact_before_;
  return summary;
}

FinetuneSummary run_finetune(const FinetuneConfig& config, const FinetuneRunOptions& options,
                             const std::function<void(const std::string&)>& note) {
  auto say = [&](const std::string& s) {
    if (note) note(s);
  };
  runs::RunDir dir = runs::RunDir::claim(options.out, runs::RunKind::Train, options.existing);
  Finetuner f(config, options.out, options.budget);
  say(str(f.train_examples().size(), " training and ", f.held_out().size(), " held-out examples (",
          f.renderer().format == SftFormat::ChatMl ? "the model's ChatML template" : "prompt + completion, no template",
          ")"));
  if (options.existing == runs::ExistingRun::Resume) {
    if (auto step = f.resume()) {
      say(str("resuming from step ", *step));
    } else {
      dir.check_nothing_to_resume();
    }
  } else {
    LOOM_CHECK(runs::list_checkpoints(options.out).empty() || options.existing == runs::ExistingRun::Overwrite,
               "finetune: ", options.out, " already holds checkpoints: continue with --resume or use --overwrite");
  }
  if (auto removed = dir.start(); !removed.empty()) say(str("--overwrite: deleted ", removed.size(), " file(s)"));
  int64_t trained = 0;
  for (nn::Parameter* p : f.model().parameters()) trained += p->value.requires_grad() ? p->value.numel() : 0;
  say(str(config.full ? "full fine-tuning of " : "LoRA: training ", trained, " of ", f.model().num_parameters(),
          " parameters for ", config.max_steps, " steps -> ", options.out));
  StopSignal stop;
  FinetuneSummary s = f.run(&stop);
  if (!s.stopped_early) f.save_outputs();
  dir.finish(s.stopped_early ? runs::RunState::Interrupted : runs::RunState::Finished, s.steps_completed);
  return s;
}

void merge_adapter_run(const std::string& base, const std::string& adapter, const std::string& out, bool overwrite,
                       const runs::MemoryBudget& budget) {
  runs::RunDir dir = runs::RunDir::claim(out, runs::RunKind::Import,
                                         overwrite ? runs::ExistingRun::Overwrite : runs::ExistingRun::Refuse);
  const bool run = is_run_dir(base);
  runs::LoadedRun loaded = runs::load_for_job(run ? base : "", run ? "" : base, budget, runs::model_memory, "merge");
  const runs::ChatSettings chat = loaded.tokenizer ? runs::chat_settings(loaded, fs::is_directory(base) ? base : "")
                                                   : runs::ChatSettings{};
  models::load_peft_adapter(*loaded.model, adapter);
  models::merge_adapters(*loaded.model);
  dir.start();
  runs::save_model_weights(*loaded.model, (fs::path(out) / "model.safetensors").string());
  if (loaded.tokenizer) {
    tokenizer::save_hf_json(*loaded.tokenizer, (fs::path(out) / "tokenizer.json").string());
    if (chat.eos || !chat.chat_template.empty()) {
      models::write_tokenizer_config(out, *loaded.tokenizer, std::nullopt, chat.eos, chat.chat_template,
                                     loaded.model->context_length());
    }
  }
  dir.finish(runs::RunState::Finished);
}

}  // namespace loom::train
