// Held-out loss and perplexity over a token file (`loom eval`).
//
// Window k takes tokens [kT, kT+T] (T+1 tokens): T inputs and the T next tokens as targets, for every
// complete window. The loss is the mean next-token cross-entropy over all windows' positions, so
// perplexity = exp(loss) is per token.
#pragma once

#include <cstdint>
#include <string>

#include "data/token_file.h"
#include "models/model.h"

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

}  // namespace loom::train
