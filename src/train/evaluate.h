// Held-out loss and perplexity over a token file (`loom eval`).
//
// Window k takes tokens [kT, kT+T] (T+1 tokens): T inputs and the T next tokens as targets, for every
// complete window. The loss is the mean next-token cross-entropy over all windows' positions, so
// perplexity = exp(loss) is per token.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "data/token_file.h"
#include "models/model.h"
#include "runs/memory.h"

namespace loom::train {

struct EvalResult {
  double loss = 0;
  double perplexity = 0;
  int64_t tokens = 0;   // predicted positions counted
  int64_t windows = 0;
  std::string to_json() const;  // {"loss": ..., "perplexity": ..., "tokens": ...}
};

// context_length 0 means the model's; max_windows 0 means all; batch_size windows per forward pass.
// A loss that is not finite (NaN or Inf weights) is an error, never a result.
EvalResult evaluate(const models::LanguageModel& model, const data::TokenFile& tokens, int64_t context_length = 0,
                    int64_t max_windows = 0, int64_t batch_size = 8);

// What `loom eval` does, the CLI aside.
struct EvalRunOptions {
  std::string run;      // a run directory, or else
  std::string weights;  // a weights file (runs/load.h load_weights)
  std::string data;     // the token file (meta.json beside it)
  int64_t context_length = 0, max_windows = 0;  // as evaluate() takes them
  // Also write the first window's inputs and logits to this safetensors file (ids [T], logits [T, V]),
  // for comparisons with other implementations; "" for none.
  std::string logits_out;
  runs::MemoryBudget budget = runs::MemoryBudget::of_machine();
};
// Loads the model (the memory of 8-window forward passes, and of the logits with logits_out, checked
// from the files' config before it is built and from the model after), checks that the data was made by
// its tokenizer (runs/consistency.h; `note` gets the note when that cannot be told), then evaluates.
EvalResult evaluate_run(const EvalRunOptions& options, const std::function<void(const std::string&)>& note = {});

// The first window of `tokens` (context_length tokens, 0: the model's) and the model's logits for it,
// to a safetensors file: ids [T] (int32), logits [T, V].
void write_first_window_logits(const models::LanguageModel& model, const data::TokenFile& tokens,
                               int64_t context_length, const std::string& path);

}  // namespace loom::train
