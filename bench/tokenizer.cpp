// Tokenizer benchmarks: BPE training on Jane Austen (130 KB -> 500 tokens, 4 MB -> 8192 tokens) and
// GPT-2 encoding throughput on 1 and 2 threads. The corpus comes from
//   python3 bench/tokenizer/austen_corpus.py data/bench/austen.txt
// run from the repository root (LOOM_BENCH_CORPUS overrides the path); GPT-2's vocabulary from data/gpt2 (tools/setup.sh).
// The comparison with tiktoken, whole process included, is bench/tokenizer/encode_vs_tiktoken.py.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tokenizer/formats.h"
#include "tokenizer/train.h"

namespace {
using namespace loom::tokenizer;

// Paths are relative to the repository root (run from there), or LOOM_SOURCE_DIR.
std::string root() {
  const char* r = std::getenv("LOOM_SOURCE_DIR");
  return r ? r : ".";
}

std::string corpus_path() {
  if (const char* p = std::getenv("LOOM_BENCH_CORPUS")) return p;
  return root() + "/data/bench/austen.txt";
}

const std::string& corpus() {
  static const std::string text = std::filesystem::exists(corpus_path()) ? read_file(corpus_path()) : std::string();
  return text;
}

std::string prefix(size_t bytes) {
  const std::string& t = corpus();
  size_t cut = t.rfind('\n', bytes);
  return t.substr(0, cut == std::string::npos ? bytes : cut + 1);
}

void train(benchmark::State& state, size_t bytes, size_t vocab) {
  if (corpus().empty()) {
    state.SkipWithError(("no corpus at " + corpus_path() + ": run bench/tokenizer/austen_corpus.py").c_str());
    return;
  }
  const std::string text = prefix(bytes);
  TrainOptions o;
  o.vocab_size = vocab;
  o.special_tokens = {"<|endoftext|>"};
  o.threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    Tokenizer tok = train_bpe_on_text(text, o);
    benchmark::DoNotOptimize(tok.merges().data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["corpus_bytes"] = static_cast<double>(text.size());
}

void BM_Train130KBTo500(benchmark::State& state) { train(state, 130000, 500); }
void BM_Train4MBTo8192(benchmark::State& state) { train(state, 1 << 30, 8192); }

void BM_EncodeGpt2(benchmark::State& state) {
  const std::string gpt2 = root() + "/data/gpt2";
  if (corpus().empty() || !std::filesystem::exists(gpt2 + "/vocab.json")) {
    state.SkipWithError("needs data/bench/austen.txt and data/gpt2 (see the header)");
    return;
  }
  static const Tokenizer tok = load_tokenizer(gpt2);
  EncodeOptions o;
  o.threads = static_cast<int>(state.range(0));
  size_t n = 0;
  for (auto _ : state) n = tok.encode(corpus(), o).size();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * corpus().size()));
  state.counters["tokens"] = static_cast<double>(n);
}

BENCHMARK(BM_Train130KBTo500)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Train4MBTo8192)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EncodeGpt2)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
