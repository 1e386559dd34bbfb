// FLOP and parameter accounting for the Llama-style model: the numbers behind MFU, `loom flops` and
// compute-optimal planning.
//
// Two estimates of training FLOPs per token:
//   * PaLM (Chowdhery et al. 2022, appendix B): 6N + 12·L·d·T, with N the non-embedding parameters (the
//     lm_head is a real matmul, so it counts; the embedding lookup is not) and 12·L·d·T the attention
//     score and value matmuls (forward + backward, full T×T as the paper counts them).
//   * Chinchilla (Hoffmann et al. 2022, appendix F): the forward pass of one sequence term by term,
//     training = 3 × forward (backward = 2 × forward). One deviation, stated in the report: the paper's
//     dense block is a two-matrix MLP, 2·T·(2·d·d_ff); our SwiGLU has three matrices, so we count
//     2·T·(3·d·d_ff) (ffn_matrices = 3). Pass ffn_matrices = 2 for the paper's exact figure.
// Chinchilla-optimal data: about 20 tokens per parameter (Hoffmann et al. 2022, table 3).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "models/llama/config.h"

namespace loom::train {

struct TrainConfig;

// The Chinchilla appendix F terms for one forward pass over one sequence of T = context_length tokens.
struct ChinchillaForward {
  double embeddings = 0;         // 2·T·V·d
  double attention_qkv = 0;      // per layer: 2·3·T·d·(H·D)
  double attention_logits = 0;   // per layer: 2·T·T·(H·D)
  double attention_softmax = 0;  // per layer: 3·H·T·T
  double attention_reduce = 0;   // per layer: 2·T·T·(H·D)
  double attention_project = 0;  // per layer: 2·T·(H·D)·d
  double dense = 0;              // per layer: 2·T·(ffn_matrices·d·d_ff)
  double logits = 0;             // 2·T·d·V
  double attention() const {
    return attention_qkv + attention_logits + attention_softmax + attention_reduce + attention_project;
  }
  double total(int64_t num_layers) const {
    return embeddings + static_cast<double>(num_layers) * (attention() + dense) + logits;
  }
};

ChinchillaForward chinchilla_forward(const llama::Config& c, int ffn_matrices = 3);
// 3 × forward / T.
double chinchilla_train_flops_per_token(const llama::Config& c, int ffn_matrices = 3);
// 6·N_non_embedding + 12·L·d·T.
double palm_train_flops_per_token(const llama::Config& c);
// 20 tokens per parameter (all parameters).
double chinchilla_optimal_tokens(int64_t params);

// Model FLOPs utilisation: achieved FLOP/s over the peak.
inline double mfu(double flops_per_token, double tokens_per_s, double peak_flops) {
  return peak_flops > 0 ? flops_per_token * tokens_per_s / peak_flops : 0.0;
}

// A rough fp32 peak for `threads` cores of this CPU: cores × clock × FLOPs/cycle, with 64 FLOPs/cycle
// for AVX-512 (two 16-lane FMA units), 32 for AVX2+FMA, 8 otherwise; the clock is /proc/cpuinfo's
// "cpu MHz" (2 GHz if absent). An estimate for MFU, not a measurement: set logging.peak_flops to override.
double estimate_cpu_peak_flops(int threads);

struct FlopsReport {
  llama::Config model;
  int64_t total_params = 0;
  int64_t non_embedding_params = 0;
  double palm_per_token = 0;
  double chinchilla_per_token = 0;
  ChinchillaForward chinchilla_terms;
  double chinchilla_optimal_tokens = 0;
  int64_t run_tokens = 0;          // max_steps × tokens_per_step
  double run_flops = 0;            // run_tokens × palm_per_token
  std::optional<double> tokens_per_s;
  std::optional<double> run_seconds;                 // run_tokens / tokens_per_s
  std::optional<double> chinchilla_optimal_seconds;  // optimal tokens / tokens_per_s
  double peak_flops = 0;                              // logging.peak_flops, or the CPU estimate
  std::optional<double> mfu;                          // at tokens_per_s, PaLM FLOPs over peak_flops
};

// peak_flops: the MFU denominator; when absent, logging.peak_flops or else estimate_cpu_peak_flops.
// (loom::cpu::measure_fma_peak measures it instead; `loom flops --measure-peak` passes that.)
FlopsReport flops_report(const TrainConfig& config, std::optional<double> tokens_per_s = std::nullopt,
                         std::optional<double> peak_flops = std::nullopt);
std::string format_flops_report(const FlopsReport& r);
nlohmann::json to_json(const FlopsReport& r);

}  // namespace loom::train
