#include "train/evaluate.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "io/safetensors.h"
#include "ops/loss.h"
#include "runs/consistency.h"
#include "runs/load.h"

namespace loom::train {

std::string EvalResult::to_json() const {
  return nlohmann::json{{"loss", loss}, {"perplexity", perplexity}, {"tokens", tokens}}.dump();
}

EvalResult evaluate(const models::LanguageModel& model, const data::TokenFile& tokens, int64_t T, int64_t max_windows,
                    int64_t batch_size) {
  if (T == 0) T = model.context_length();
  LOOM_CHECK(T >= 1 && T <= model.context_length(), "eval: context length ", T,
             " must be in [1, ", model.context_length(), "] (the model's context_length)");
  LOOM_CHECK(batch_size >= 1, "eval: batch size must be >= 1, got ", batch_size);
  LOOM_CHECK(max_windows >= 0, "eval: max_windows must be >= 0, got ", max_windows);
  int64_t windows = tokens.size() >= T + 1 ? (tokens.size() - 1) / T : 0;
  LOOM_CHECK(windows > 0, "eval: ", tokens.path(), " has ", tokens.size(), " tokens, fewer than one window of ",
             T + 1);
  if (max_windows > 0) windows = std::min(windows, max_windows);
  const int64_t V = model.vocab_size();
  if (tokens.max_token() >= static_cast<uint32_t>(V)) {
    LOOM_FAIL("eval: ", tokens.path(), " holds token id ", tokens.max_token(), ", outside the model's vocabulary of ", V);
  }
  autograd::NoGradGuard no_grad;
  double total = 0;  // sum of per-window mean losses times T, in double
  for (int64_t w0 = 0; w0 < windows; w0 += batch_size) {
    const int64_t B = std::min(batch_size, windows - w0);
    Tensor inputs = Tensor::empty({B, T}, DType::I32), targets = Tensor::empty({B, T}, DType::I32);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = (w0 + b) * T;
      tokens.copy_to(start, T, inputs.data<int32_t>() + b * T);
      tokens.copy_to(start + 1, T, targets.data<int32_t>() + b * T);
    }
    total += static_cast<double>(model.loss(inputs, targets).item()) * static_cast<double>(B * T);
  }
  EvalResult r;
  r.windows = windows;
  r.tokens = windows * T;
  r.loss = total / static_cast<double>(r.tokens);
  LOOM_CHECK(std::isfinite(r.loss), "eval: the loss over ", windows, " windows of ", tokens.path(), " is ", r.loss,
             ": the model's outputs are not finite (its weights may hold NaN or Inf), so there is no loss to report");
  r.perplexity = std::exp(r.loss);
  return r;
}

EvalResult evaluate_run(const EvalRunOptions& o, const std::function<void(const std::string&)>& note) {
  const std::string source = o.run.empty() ? o.weights : o.run;
  // The whole job's memory, checked from the model's config before the model is built.
  const bool logits = !o.logits_out.empty();
  const int64_t context_length = o.context_length;
  const auto job = [logits, context_length](const models::ModelConfig& m) {
    return runs::inference_memory(m, 8, context_length, logits ? m.context_length() : 0);
  };
  auto loaded = o.run.empty() ? runs::load_weights(o.weights, o.budget, job) : runs::load_run(o.run, o.budget, job);
  auto tokens = data::TokenFile::open(o.data);
  // Before any compute: the data was made by the run's tokenizer.
  const std::string data_note = runs::check_eval_data(loaded, source, o.data);
  if (!data_note.empty() && note) note(data_note);
  runs::check_memory(job(loaded.model->model_config()), o.budget, "eval");  // an HF import's model
  EvalResult r = evaluate(*loaded.model, tokens, o.context_length, o.max_windows);
  if (logits) write_first_window_logits(*loaded.model, tokens, o.context_length, o.logits_out);
  return r;
}

void write_first_window_logits(const models::LanguageModel& model, const data::TokenFile& tokens,
                               int64_t context_length, const std::string& path) {
  const int64_t T = context_length > 0 ? context_length : model.context_length();
  LOOM_CHECK(tokens.size() > T, "eval: --logits-out needs at least ", T + 1, " tokens, the file has ", tokens.size());
  std::vector<int32_t> ids(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(tokens[i]);
  Tensor x = Tensor::from_vector<int32_t>({1, T}, ids);
  autograd::NoGradGuard no_grad;
  Tensor logits = model.logits(x).detach();
  io::write_safetensors(path, io::NamedTensors{{"ids", x.view({T})}, {"logits", logits.view({T, logits.shape()[2]})}});
}

}  // namespace loom::train
