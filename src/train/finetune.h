// Fine-tuning a pretrained model on chat data (`loom finetune`): LoRA adapters on a frozen base (the
// default) or every weight (full), with the loss on the assistant's tokens (train/sft_data.h).
//
// A fine-tuning run directory:
//   config.json         the resolved FinetuneConfig
//   run.json, .lock     as every loom run (runs/run_dir.h)
//   metrics.jsonl       train, val and exact_match events
//   checkpoints/step_N  LoRA: adapter.safetensors (the adapters under loom's names) + optimizer.safetensors
//                       (their AdamW moments: the base is frozen and has none) + trainer_state.json;
//                       full: model.safetensors + optimizer.safetensors + trainer_state.json
//   adapter/            LoRA, at the end: PEFT's adapter_config.json + adapter_model.safetensors
//                       (models/adapters.h), what peft.PeftModel.from_pretrained loads
//   model.safetensors   full, at the end: the weights (with tokenizer.json and tokenizer_config.json
//                       beside them, a run `loom chat/generate/export --run` reads)
//
// Exactness: a step's batches, dropout masks and adapter initialisation are keyed by the seed (and step,
// micro-batch), so a run resumed from a checkpoint continues with the bits of an uninterrupted one.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/json_checked.h"
#include "models/adapters.h"
#include "models/model.h"
#include "runs/memory.h"
#include "runs/run_dir.h"
#include "tokenizer/tokenizer.h"
#include "train/optimizer.h"
#include "train/sft_data.h"
#include "train/stop_signal.h"

namespace loom::train {

struct FinetuneConfig {
  // base
  std::string weights;     // a GGUF file, a Hugging Face directory, a loom weights file or run directory
  int64_t context_length = 0;  // 0: the model's; smaller saves memory (examples must fit)
  // A GGUF base whose matrices stay in their block format (QLoRA): the layers multiply by them a tile at a
  // time (nn::Linear::dequantized_matmul), their f32 copies are released; LoRA only.
  bool quantized = false;
  // data
  std::string data;        // JSON Lines (train/sft_data.h)
  std::string val_data;    // held-out JSON Lines; "" holds out val_fraction of `data`
  double val_fraction = 0.1;
  // Pack each batch's examples into rows of the context length (train/sft_data.h: sft_packed_batch), with
  // document masking and positions restarting per example. The same examples and trained tokens as
  // without it, so the same run up to rounding, less the padding. Off by default: with examples of similar
  // lengths (most chat SFT sets) the padding it removes is small, and unpacked batches are what PEFT and
  // TRL's SFTTrainer run by default (packing=False), so comparisons with them hold as they are.
  bool packing = false;
  // method
  bool full = false;       // every weight trained, instead of LoRA adapters
  models::AdapterConfig adapter;
  // optimization (AdamW, warmup then cosine to min_lr)
  double lr = 2e-4, min_lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, grad_clip = 1.0;
  int64_t warmup_steps = 0;
  int64_t max_steps = 100, batch_size = 4, grad_accum_steps = 1;
  uint64_t seed = 1337;
  int64_t threads = 0;
  std::string precision = "f32";  // or "bf16" (mixed-precision GEMMs)
  std::string recompute = "none"; // activation recomputation, as loom train's (models::Recompute)
  // evaluation
  int64_t eval_interval = 50;     // steps between held-out losses (and one at the start and the end); 0: none
  int64_t exact_match = 64;       // held-out examples whose last reply is generated greedily at the end; 0: none
  int64_t max_new_tokens = 64;
  // checkpoints and logs
  int64_t checkpoint_interval = 50, keep_last = 2;
  int64_t log_interval = 10;
  std::string progress = "auto";

  // Every key with its default (the JSON's sections: base, data, lora, optimizer, training, eval,
  // checkpoint, logging).
  nlohmann::json to_json() const;
  // The relations between its keys, checked by validate() and listed by `loom options --json`.
  static const std::vector<io::KeyRelation>& relations();
  // Defaults <- j (partial), checked key by key (an unknown key or a wrong type is an error naming it).
  static FinetuneConfig from_json(const nlohmann::json& j);
  // from_json of `j` with "section.key=value" overrides applied.
  static FinetuneConfig with_overrides(const nlohmann::json& j, const std::vector<std::string>& sets);
  void validate() const;
};

struct FinetuneSummary {
  int64_t steps_completed = 0;
  double last_loss = 0;
  std::optional<double> first_val_loss, last_val_loss;
  std::optional<double> exact_match_before, exact_match_after;  // fraction of held-out replies reproduced
  int64_t exact_match_examples = 0;
  double tokens_per_s = 0;  // trained (assistant) tokens per second over this run's steps
  double seconds = 0;
  bool stopped_early = false;
};

// Greedy replies to held-out prompts, compared with their references.
struct ExactMatch {
  int64_t matched = 0, total = 0;
  double fraction() const { return total > 0 ? static_cast<double>(matched) / static_cast<double>(total) : 0.0; }
};

class Finetuner {
 public:
  // Loads the base, renders the data, attaches adapters (or not: full) and builds the optimizer over the
  // trained parameters only.
  Finetuner(FinetuneConfig config, std::string run_dir,
            const runs::MemoryBudget& memory = runs::MemoryBudget::of_machine());
  ~Finetuner();

  FinetuneSummary run(const StopSignal* stop = nullptr);
  // Mean loss per trained token over the held-out examples.
  double validation_loss();
  // Greedy replies (up to max_new_tokens) to the first `limit` held-out examples. Layers held quantized
  // decode with the integer kernels here (as `loom chat` would run them), not their dequantized tiles.
  // A requested `stop` ends it early (the fraction is then of the replies generated).
  ExactMatch exact_match(int64_t limit, const StopSignal* stop = nullptr);

  std::string save_checkpoint();
  void load_checkpoint(const std::string& dir);
  // The newest valid checkpoint, if any: the step resumed from.
  std::optional<int64_t> resume();
  // adapter/ (LoRA) or model.safetensors + tokenizer (full) into the run directory.
  void save_outputs();

  models::LanguageModel& model() { return *model_; }
  AdamW& optimizer() { return *optimizer_; }
  const FinetuneConfig& config() const { return config_; }
  int64_t step() const { return step_; }
  const std::vector<SftExample>& train_examples() const { return train_; }
  const std::vector<SftExample>& held_out() const { return held_out_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const SftRenderer& renderer() const { return renderer_; }

 private:
  double loss_of(const data::Batch& b, const models::ForwardContext& ctx);
  nlohmann::json state_json() const;
  FinetuneConfig config_;
  std::string run_dir_;
  std::unique_ptr<models::LanguageModel> model_;
  std::optional<tokenizer::Tokenizer> tokenizer_;
  std::string chat_template_;
  std::optional<tokenizer::TokenId> eos_;
  SftRenderer renderer_;
  std::vector<SftExample> train_, held_out_;
  std::unique_ptr<SftLoader> loader_;
  int64_t pack_length_ = 0;  // data.packing: the context length; else 0
  std::vector<nn::Parameter*> trained_;
  std::unique_ptr<AdamW> optimizer_;
  int64_t step_ = 0;
  std::optional<double> first_val_loss_, last_val_loss_;
  std::optional<double> exact_before_;
};

// What `loom finetune` does: claims the run directory (new, or resume/overwrite one of loom's), trains,
// saves the outputs and marks how the run ended. `note` gets the console lines.
struct FinetuneRunOptions {
  std::string out;
  runs::ExistingRun existing = runs::ExistingRun::Refuse;
  runs::MemoryBudget budget = runs::MemoryBudget::of_machine();
};
FinetuneSummary run_finetune(const FinetuneConfig& config, const FinetuneRunOptions& options,
                             const std::function<void(const std::string&)>& note = {});

// A base with adapters merged into it, written as a loom run directory `out` (model.safetensors,
// tokenizer.json, tokenizer_config.json with the chat template) that `loom export --run` converts to HF
// or GGUF. `adapter` is PEFT's directory (a fine-tuning run's adapter/).
void merge_adapter_run(const std::string& base, const std::string& adapter, const std::string& out, bool overwrite,
                       const runs::MemoryBudget& budget = runs::MemoryBudget::of_machine());

}  // namespace loom::train
