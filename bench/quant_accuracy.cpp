// What rounding the activations costs a quantized model (docs/quant.md, "Which activation rounding"):
// the same GGUF file run three ways, weights kept quantized with activations rounded to int8
// (llama.cpp's choice) or to int8x2 (value + residual), and with the weights dequantized to f32, the
// reference that only differs by the activation rounding.
//
//   loom_bench_quant_accuracy FILE.gguf TEXT_FILE PROMPTS_FILE [MAX_NEW_TOKENS]
//
// Prints, for each way: the mean loss (nats per token) over TEXT_FILE, in windows of up to 512 tokens;
// then, for each line of PROMPTS_FILE asked as a chat turn (greedy), whether the reply equals the f32
// reply, and where it first differs, the f32 model's gap between its top two logits there (a small gap:
// the f32 choice was a near tie any rounding may flip; a large one: the rounding changed a clear answer).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/error.h"
#include "generate/chat.h"
#include "quant/qmatmul.h"
#include "runs/load.h"
#include "runs/memory.h"

using namespace loom;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOOM_CHECK(in, "cannot read ", path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Mean next-token loss over ids, in windows of up to `window` tokens (each window predicts its own
// tokens 1..n-1 from their prefixes).
double mean_loss(const models::LanguageModel& model, const std::vector<int32_t>& ids, int64_t window) {
  double total = 0;
  int64_t count = 0;
  for (size_t start = 0; start + 1 < ids.size(); start += static_cast<size_t>(window)) {
    const size_t end = std::min(ids.size(), start + static_cast<size_t>(window));
    const std::vector<int32_t> w(ids.begin() + static_cast<long>(start), ids.begin() + static_cast<long>(end));
    const int64_t T = static_cast<int64_t>(w.size());
    const Tensor logits = model.logits(Tensor::from_vector<int32_t>({1, T}, w));  // [1, T, V]
    const int64_t V = logits.shape().back();
    const float* l = logits.data<float>();
    for (int64_t t = 0; t + 1 < T; ++t) {
      const float* row = l + t * V;
      const float mx = *std::max_element(row, row + V);
      double sum = 0;
      for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
      total += (std::log(sum) + mx) - row[w[static_cast<size_t>(t + 1)]];
      ++count;
    }
  }
  return total / static_cast<double>(count);
}

struct Reply {
  std::vector<int32_t> tokens;
  std::vector<int32_t> conversation;  // prompt and reply (and the template's closing tokens)
  int64_t prompt_length = 0;
};

Reply greedy_reply(const models::LanguageModel& model, const tokenizer::Tokenizer& tok, const runs::ChatSettings& s,
                   const std::string& question, int64_t max_new_tokens) {
  generate::GenerateOptions g;
  g.max_new_tokens = max_new_tokens;
  g.sampling.temperature = 0;
  generate::ChatSession chat(model, tok, generate::ChatTemplate::from_jinja(s.chat_template), std::nullopt, g, s.eos);
  Reply r;
  r.tokens = chat.turn(question).tokens;
  r.conversation = chat.conversation();
  r.prompt_length = static_cast<int64_t>(chat.last_prefill().size());  // a fresh chat: all of the prompt
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    LOOM_CHECK(argc >= 4, "usage: loom_bench_quant_accuracy FILE.gguf TEXT_FILE PROMPTS_FILE [MAX_NEW_TOKENS]");
    const std::string gguf = argv[1];
    const int64_t max_new = argc > 4 ? std::stoll(argv[4]) : 48;
    autograd::NoGradGuard no_grad;
    const auto budget = runs::MemoryBudget::from_setting("");
    const auto job = [](const models::ModelConfig& m) { return runs::generation_memory(m); };
    auto quantized = runs::load_for_job("", gguf, budget, job, "quant_accuracy", /*quantized_gguf=*/true);
    auto f32 = runs::load_for_job("", gguf, budget, job, "quant_accuracy", /*quantized_gguf=*/false);
    LOOM_CHECK(quantized.tokenizer.has_value(), "no tokenizer in ", gguf);
    const auto& tok = *quantized.tokenizer;
    const runs::ChatSettings settings = runs::chat_settings(quantized, "");

    const std::vector<int32_t> text = [&] {
      const auto ids = tok.encode(read_file(argv[2]));
      return std::vector<int32_t>(ids.begin(), ids.end());
    }();
    std::vector<std::string> prompts;
    {
      std::istringstream in(read_file(argv[3]));
      for (std::string line; std::getline(in, line);) {
        if (!line.empty()) prompts.push_back(line);
      }
    }
    const quant::ActivationRounding kRoundings[] = {quant::ActivationRounding::Int8, quant::ActivationRounding::Int8x2};

    std::printf("# %s: %zu text tokens, %zu prompts, %lld new tokens at most\n", gguf.c_str(), text.size(),
                prompts.size(), static_cast<long long>(max_new));
    std::printf("| weights | activations | loss (nats/token) | - f32 |\n|---|---|---|---|\n");
    const double f32_loss = mean_loss(*f32.model, text, 512);
    std::printf("| f32 (dequantized) | f32 | %.4f | 0 |\n", f32_loss);
    for (auto r : kRoundings) {
      quant::set_default_activation_rounding(r);
      const double loss = mean_loss(*quantized.model, text, 512);
      std::printf("| quantized | %s | %.4f | %+.4f |\n", quant::activation_rounding_name(r), loss, loss - f32_loss);
    }

    std::printf("\n| prompt | int8: same as f32? | int8x2: same as f32? |\n|---|---|---|\n");
    int same[2] = {0, 0}, clear_diff[2] = {0, 0};
    for (const std::string& p : prompts) {
      const Reply ref = greedy_reply(*f32.model, tok, settings, p, max_new);
      // The f32 model's top-two gap at every reply position, on its own greedy path.
      const int64_t first = ref.prompt_length, T = first + static_cast<int64_t>(ref.tokens.size());
      const std::vector<int32_t> path(ref.conversation.begin(), ref.conversation.begin() + T);
      const Tensor logits = f32.model->logits(Tensor::from_vector<int32_t>({1, T}, path));
      const int64_t V = logits.shape().back();
      auto gap_at = [&](size_t i) {  // logits predicting reply token i
        const float* row = logits.data<float>() + (first + static_cast<int64_t>(i) - 1) * V;
        std::vector<float> top(row, row + V);
        std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
        return top[0] - top[1];
      };
      std::printf("| %.60s |", p.c_str());
      for (int k = 0; k < 2; ++k) {
        quant::set_default_activation_rounding(kRoundings[k]);
        const Reply q = greedy_reply(*quantized.model, tok, settings, p, max_new);
        // The logits for the first reply token, f32 against quantized, on the same prompt.
        const std::vector<int32_t> prompt(ref.conversation.begin(), ref.conversation.begin() + first);
        const Tensor lq = quantized.model->logits(Tensor::from_vector<int32_t>({1, first}, prompt));
        float max_diff = 0;
        for (int64_t v = 0; v < V; ++v) {
          max_diff = std::max(max_diff, std::fabs(lq.data<float>()[(first - 1) * V + v] - logits.data<float>()[(first - 1) * V + v]));
        }
        std::printf(" max Δlogit %.3f,", max_diff);
        size_t i = 0;
        while (i < q.tokens.size() && i < ref.tokens.size() && q.tokens[i] == ref.tokens[i]) ++i;
        if (i == q.tokens.size() && i == ref.tokens.size()) {
          ++same[k];
          std::printf(" yes |");
        } else {
          const float gap = i < ref.tokens.size() ? gap_at(i) : 0.0f;
          if (gap > 1.0f) ++clear_diff[k];
          std::printf(" differs at token %zu (f32 top-2 gap %.2f) |", i, gap);
        }
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    for (int k = 0; k < 2; ++k) {
      std::printf("\n%s: %d of %zu replies equal to f32's; %d differ where f32's top two logits were over 1.0 apart",
                  quant::activation_rounding_name(kRoundings[k]), same[k], prompts.size(), clear_diff[k]);
    }
    std::printf("\n");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
