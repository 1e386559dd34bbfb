#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace loom::generate {

void SamplingOptions::validate() const {
  LOOM_CHECK(temperature >= 0 && std::isfinite(temperature), "temperature must be >= 0, got ", temperature);
  LOOM_CHECK(top_k >= 0, "top_k must be >= 0, got ", top_k);
  LOOM_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got ", top_p);
}

namespace {

// One pass over the logits: the first index of the largest, and whether any is NaN or +Inf. Sixteen
// lanes each keep their own first maximum (a strict `>`, so a later equal value never replaces it); the
// lanes' winners then meet, ties going to the lower index: std::max_element's answer. At temperature 0 this scan is all of sampling, once per sequence
// and step: the server's 16-sequence steps spent ~2 ms in a scalar check and max_element before.
struct Scan {
  int64_t argmax;
  bool not_finite;  // some logit is NaN or +Inf
};

Scan scan_logits(const float* logits, int64_t V) {
  // GCC/Clang vector types (as backends/cpu/softmax.h): 16 lanes, compiled to what the target has.
  using f32x16 = float __attribute__((vector_size(64)));
  using i32x16 = int32_t __attribute__((vector_size(64)));
  constexpr int kLanes = 16;
  f32x16 best;
  i32x16 where, index, bad{};
  for (int j = 0; j < kLanes; ++j) {
    best[j] = -INFINITY;
    where[j] = -1;
    index[j] = j;
  }
  const f32x16 inf = best * -1.0f;
  const i32x16 step = index * 0 + kLanes;
  const int64_t body = V - V % kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    f32x16 x;
    std::memcpy(&x, logits + i, sizeof x);
    bad |= ~(x < inf);  // NaN fails every comparison; +Inf fails this one
    const i32x16 up = x > best;
    best = up ? x : best;
    where = up ? index : where;
    index += step;
  }
  Scan out{-1, false};
  float top = -INFINITY;
  for (int j = 0; j < kLanes; ++j) {
    out.not_finite = out.not_finite || bad[j] != 0;
    if (where[j] >= 0 && (best[j] > top || (best[j] == top && where[j] < out.argmax))) {
      top = best[j];
      out.argmax = where[j];
    }
  }
  for (int64_t i = body; i < V; ++i) {
    out.not_finite = out.not_finite || !(logits[i] < INFINITY);
    if (logits[i] > top) {
      top = logits[i];
      out.argmax = i;
    }
  }
  return out;
}

}  // namespace

int32_t sample_token(const float* logits, int64_t V, const SamplingOptions& o, RngKey key, uint64_t index) {
  o.validate();
  LOOM_CHECK(V > 0 && V <= INT32_MAX, "sample_token: the vocabulary size must be in [1, 2^31), got ", V);
  const Scan scan = scan_logits(logits, V);
  if (scan.not_finite) {
    // Logits that hold NaN or +Inf have no distribution to sample from: argmax would return the same
    // token over and over (NaN compares false), softmax would be NaN. An error, not a stream of one token
    // (issue 32). Found, the first such logit is named.
    for (int64_t i = 0; i < V; ++i) {
      LOOM_CHECK(!std::isnan(logits[i]) && logits[i] != INFINITY, "generate: the model's logits are not finite (",
                 logits[i], " for token ", i, " of ", V, ", sampling token ", index,
                 "): its weights or its computation produced NaN or Inf, so there is nothing to sample");
    }
  }
  // -Inf is a token ruled out, unless every token is (then no lane ever rose above -Inf).
  LOOM_CHECK(scan.argmax >= 0, "generate: every logit is -inf (sampling token ", index, "): no token can be sampled");
  if (o.temperature == 0.0f || o.top_k == 1) return static_cast<int32_t>(scan.argmax);
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
