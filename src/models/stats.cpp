#include "models/stats.h"

#include <algorithm>

#include "core/error.h"

namespace loom::models {

ChinchillaForward chinchilla_forward(const ChinchillaShape& s) {
  const double T = static_cast<double>(s.context_length), V = static_cast<double>(s.vocab_size);
  const double d = static_cast<double>(s.d_model), H = static_cast<double>(s.num_heads);
  const double HD = H * static_cast<double>(s.head_dim), F = static_cast<double>(s.d_ff);
  const double KVD = static_cast<double>(s.num_kv_heads * s.head_dim);  // width of k and of v
  ChinchillaForward f;
  f.embeddings = 2 * T * V * d;
  f.attention_qkv = 2 * T * d * (HD + 2 * KVD);
  f.attention_logits = 2 * T * T * HD;
  f.attention_softmax = 3 * H * T * T;
  f.attention_reduce = 2 * T * T * HD;
  f.attention_project = 2 * T * HD * d;
  f.dense = 2 * T * (s.ffn_matrices * d * F);
  f.logits = 2 * T * d * V;
  f.num_layers = s.num_layers;
  f.context_length = s.context_length;
  return f;
}

std::string chinchilla_train_flops_exact(const ModelStats& s, int64_t tokens) {
  LOOM_CHECK(tokens >= 0, "flops: tokens must be >= 0, got ", tokens);
  const ChinchillaForward& c = s.chinchilla;
  // Every term is an integer below 2^53, so the double sum per sequence is exact; the product with the
  // token count is done in 128 bits.
  const double forward = c.total();
  LOOM_CHECK(forward < 9.0e15, "flops: forward FLOPs per sequence ", forward, " too large to count exactly");
  unsigned __int128 total = static_cast<unsigned __int128>(static_cast<uint64_t>(forward)) * 3u *
                            static_cast<uint64_t>(tokens) / static_cast<uint64_t>(c.context_length);
  if (total == 0) return "0";
  std::string digits;
  while (total > 0) {
    digits.push_back(static_cast<char>('0' + static_cast<int>(total % 10)));
    total /= 10;
  }
  std::reverse(digits.begin(), digits.end());
  return digits;
}

}  // namespace loom::models
