#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace loom::generate {

void SamplingOptions::validate() const {
  LOOM_CHECK(temperature >= 0 && std::isfinite(temperature), "temperature must be >= 0, got ", temperature);
  LOOM_CHECK(top_k >= 0, "top_k must be >= 0, got ", top_k);
  LOOM_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got ", top_p);
}

int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& o, RngKey key, uint64_t index) {
  o.validate();
  LOOM_CHECK(V > 0, "sample_token: empty vocabulary");
  // Logits that hold NaN or +Inf have no distribution to sample from: argmax would return the same token
  // over and over (NaN compares false), softmax would be NaN. An error, not a stream of one token
  // (issue 32). -Inf is a token ruled out, unless every token is.
  bool any = false;
  for (int64_t i = 0; i < V; ++i) {
    LOOM_CHECK(!std::isnan(logits[i]) && logits[i] != INFINITY, "generate: the model's logits are not finite (",
               logits[i], " for token ", i, " of ", V, ", sampling token ", index,
               "): its weights or its computation produced NaN or Inf, so there is nothing to sample");
    any = any || logits[i] != -INFINITY;
  }
  LOOM_CHECK(any, "generate: every logit is -inf (sampling token ", index, "): no token can be sampled");
  if (o.temperature == 0.0f || o.top_k == 1) {
    return static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
  }
  // Candidates sorted by logit, descending (stable: ties keep id order).
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = (o.top_k > 0 && o.top_k < V) ? o.top_k : V;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  order.resize(static_cast<size_t>(keep));
  // Softmax over the candidates at this temperature (max-subtracted), in double.
  std::vector<double> p(order.size());
  const double top = logits[order[0]];
  double total = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    p[i] = std::exp((logits[order[i]] - top) / o.temperature);
    total += p[i];
  }
  for (double& x : p) x /= total;
  // Nucleus: the smallest prefix whose mass reaches top_p.
  if (o.top_p < 1.0f) {
    double mass = 0;
    size_t n = 0;
    while (n < p.size()) {
      mass += p[n++];
      if (mass >= o.top_p) break;
    }
    p.resize(n);
    double kept = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& x : p) x /= kept;
  }
  double u = random_uniform(key, index);
  double cumulative = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    cumulative += p[i];
    if (u < cumulative) return order[i];
  }
  return order[p.size() - 1];
}

}  // namespace loom::generate
