#include "train/flops.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "train/config.h"
#include "train/progress.h"

namespace loom::train {

ChinchillaForward chinchilla_forward(const llama::Config& c, int ffn_matrices) {
  const double T = static_cast<double>(c.context_length), V = static_cast<double>(c.vocab_size);
  const double d = static_cast<double>(c.d_model), H = static_cast<double>(c.num_heads);
  const double HD = H * static_cast<double>(c.head_dim()), F = static_cast<double>(c.d_ff);
  const double KVD = static_cast<double>(c.kv_heads() * c.head_dim());  // width of k and of v
  ChinchillaForward f;
  f.embeddings = 2 * T * V * d;
  f.attention_qkv = 2 * T * d * (HD + 2 * KVD);
  f.attention_logits = 2 * T * T * HD;
  f.attention_softmax = 3 * H * T * T;
  f.attention_reduce = 2 * T * T * HD;
  f.attention_project = 2 * T * HD * d;
  f.dense = 2 * T * (ffn_matrices * d * F);
  f.logits = 2 * T * d * V;
  return f;
}

double chinchilla_train_flops_per_token(const llama::Config& c, int ffn_matrices) {
  return 3 * chinchilla_forward(c, ffn_matrices).total(c.num_layers) / static_cast<double>(c.context_length);
}

double palm_train_flops_per_token(const llama::Config& c) {
  return 6.0 * static_cast<double>(c.non_embedding_params()) +
         12.0 * static_cast<double>(c.num_layers) * static_cast<double>(c.d_model) *
             static_cast<double>(c.context_length);
}

double chinchilla_optimal_tokens(int64_t params) { return 20.0 * static_cast<double>(params); }

double estimate_cpu_peak_flops(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double mhz = 2000;
  double per_cycle = 8;
  std::ifstream in("/proc/cpuinfo");
  bool got_mhz = false, got_flags = false;
  for (std::string line; std::getline(in, line) && !(got_mhz && got_flags);) {
    if (!got_mhz && line.rfind("cpu MHz", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        double v = std::atof(line.c_str() + colon + 1);
        if (v > 100) mhz = v;
      }
      got_mhz = true;
    } else if (!got_flags && line.rfind("flags", 0) == 0) {
      std::string flags = line + " ";
      if (flags.find(" avx512f ") != std::string::npos) {
        per_cycle = 64;
      } else if (flags.find(" avx2 ") != std::string::npos && flags.find(" fma ") != std::string::npos) {
        per_cycle = 32;
      }
      got_flags = true;
    }
  }
  return threads * mhz * 1e6 * per_cycle;
}

FlopsReport flops_report(const TrainConfig& config, std::optional<double> tokens_per_s,
                         std::optional<double> peak_flops) {
  FlopsReport r;
  r.model = config.model;
  r.total_params = config.model.total_params();
  r.non_embedding_params = config.model.non_embedding_params();
  r.palm_per_token = palm_train_flops_per_token(config.model);
  r.chinchilla_terms = chinchilla_forward(config.model);
  r.chinchilla_per_token = chinchilla_train_flops_per_token(config.model);
  r.chinchilla_optimal_tokens = chinchilla_optimal_tokens(r.total_params);
  r.run_tokens = config.training.max_steps * config.tokens_per_step();
  r.run_flops = static_cast<double>(r.run_tokens) * r.palm_per_token;
  r.peak_flops = peak_flops                          ? *peak_flops
                 : config.logging.peak_flops > 0 ? config.logging.peak_flops
                                                 : estimate_cpu_peak_flops(static_cast<int>(config.training.threads));
  if (tokens_per_s && *tokens_per_s > 0) {
    r.tokens_per_s = tokens_per_s;
    r.mfu = mfu(r.palm_per_token, *tokens_per_s, r.peak_flops);
    r.run_seconds = static_cast<double>(r.run_tokens) / *tokens_per_s;
    r.chinchilla_optimal_seconds = r.chinchilla_optimal_tokens / *tokens_per_s;
  }
  return r;
}

namespace {
std::string si(double v) {
  char buf[32];
  const char* units[] = {"", "K", "M", "G", "T", "P", "E"};
  int u = 0;
  while (v >= 1000 && u < 6) {
    v /= 1000;
    ++u;
  }
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f%s" : "%.2f%s", v, units[u]);
  return buf;
}
std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3e", v);
  return buf;
}
}  // namespace

std::string format_flops_report(const FlopsReport& r) {
  const auto& m = r.model;
  const double L = static_cast<double>(m.num_layers), T = static_cast<double>(m.context_length);
  std::ostringstream o;
  o << "model: vocab_size=" << m.vocab_size << " context_length=" << m.context_length << " d_model=" << m.d_model
    << " num_layers=" << m.num_layers << " num_heads=" << m.num_heads << " num_kv_heads=" << m.kv_heads()
    << " d_ff=" << m.d_ff << "\n";
  o << "parameters: " << r.total_params << " total (" << si(static_cast<double>(r.total_params)) << "), "
    << r.non_embedding_params << " non-embedding (" << si(static_cast<double>(r.non_embedding_params)) << ")\n";
  o << "training FLOPs per token:\n";
  o << "  6N + 12*L*d*T (PaLM, N non-embedding): " << sci(r.palm_per_token) << "  (6N "
    << sci(6.0 * static_cast<double>(r.non_embedding_params)) << " + attention "
    << sci(12.0 * L * static_cast<double>(m.d_model) * T) << ")\n";
  const auto& c = r.chinchilla_terms;
  o << "  Chinchilla appendix F (3 x forward):   " << sci(r.chinchilla_per_token)
    << "  (dense block counted with SwiGLU's 3 matrices)\n";
  o << "    forward per token: embeddings " << sci(c.embeddings / T) << ", attention " << sci(L * c.attention() / T)
    << ", dense " << sci(L * c.dense / T) << ", logits " << sci(c.logits / T) << "\n";
  o << "Chinchilla-optimal tokens (20 per parameter): " << si(r.chinchilla_optimal_tokens) << "\n";
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%.3g",
                r.chinchilla_optimal_tokens > 0 ? static_cast<double>(r.run_tokens) / r.chinchilla_optimal_tokens : 0);
  o << "this run: " << si(static_cast<double>(r.run_tokens)) << " tokens (" << ratio << " x Chinchilla-optimal), "
    << sci(r.run_flops) << " FLOPs (6N + attention)\n";
  if (r.tokens_per_s) {
    o << "at " << si(*r.tokens_per_s) << " tokens/s: this run " << format_duration(*r.run_seconds)
      << ", Chinchilla-optimal " << format_duration(*r.chinchilla_optimal_seconds) << "; "
      << sci(*r.tokens_per_s * r.palm_per_token) << " FLOP/s achieved";
    char buf[64];
    std::snprintf(buf, sizeof(buf), ", MFU %.1f%% of ", 100.0 * r.mfu.value_or(0));
    o << buf << sci(r.peak_flops) << " FLOP/s peak\n";
  } else {
    o << "(give --tokens-per-s or --run DIR for time estimates)\n";
  }
  return o.str();
}

nlohmann::json to_json(const FlopsReport& r) {
  nlohmann::json j{{"total_params", r.total_params},
                   {"non_embedding_params", r.non_embedding_params},
                   {"palm_flops_per_token", r.palm_per_token},
                   {"chinchilla_flops_per_token", r.chinchilla_per_token},
                   {"chinchilla_optimal_tokens", r.chinchilla_optimal_tokens},
                   {"run_tokens", r.run_tokens},
                   {"run_flops", r.run_flops}};
  if (r.tokens_per_s) {
    j["tokens_per_s"] = *r.tokens_per_s;
    j["run_seconds"] = *r.run_seconds;
    j["chinchilla_optimal_seconds"] = *r.chinchilla_optimal_seconds;
    j["mfu"] = r.mfu.value_or(0);
  }
  j["peak_flops"] = r.peak_flops;
  return j;
}

}  // namespace loom::train
