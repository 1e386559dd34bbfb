#include "nn/kv_cache.h"

#include <cstring>

namespace loom::nn {

KVCache::KVCache(int64_t num_layers, int64_t batch, int64_t num_heads, int64_t capacity, int64_t head_dim)
    : capacity_(capacity) {
  LOOM_CHECK(num_layers > 0 && batch > 0 && num_heads > 0 && capacity > 0 && head_dim > 0,
             "KVCache: sizes must be positive: layers=", num_layers, " batch=", batch, " heads=", num_heads,
             " capacity=", capacity, " head_dim=", head_dim);
  for (int64_t i = 0; i < num_layers; ++i) {
    layers_.push_back({Tensor::zeros({batch, num_heads, capacity, head_dim}),
                       Tensor::zeros({batch, num_heads, capacity, head_dim})});
  }
}

namespace {
// Copies rows between [B, H, rows, D] layouts with different row counts.
void copy_rows(const float* src, int64_t src_rows, int64_t src_start, float* dst, int64_t dst_rows,
               int64_t dst_start, int64_t count, int64_t BH, int64_t D) {
  for (int64_t bh = 0; bh < BH; ++bh) {
    std::memcpy(dst + (bh * dst_rows + dst_start) * D, src + (bh * src_rows + src_start) * D,
                static_cast<size_t>(count * D) * sizeof(float));
  }
}
}  // namespace

void KVCache::write(int64_t layer, const Tensor& k, const Tensor& v) {
  LayerKV& kv = layers_.at(static_cast<size_t>(layer));
  const Shape& s = kv.k.shape();
  const int64_t t = k.size(2);
  LOOM_CHECK(k.shape() == v.shape() && k.ndim() == 4 && k.size(0) == s[0] && k.size(1) == s[1] && k.size(3) == s[3],
             "KVCache::write: keys ", k.describe(), " / values ", v.describe(), " do not fit cache ", kv.k.describe());
  LOOM_CHECK(length_ + t <= capacity_, "KVCache: ", length_, " + ", t, " tokens exceed the capacity ", capacity_);
  copy_rows(k.data<float>(), t, 0, kv.k.data<float>(), capacity_, length_, t, s[0] * s[1], s[3]);
  copy_rows(v.data<float>(), t, 0, kv.v.data<float>(), capacity_, length_, t, s[0] * s[1], s[3]);
}

std::pair<Tensor, Tensor> KVCache::read(int64_t layer, int64_t t) const {
  const LayerKV& kv = layers_.at(static_cast<size_t>(layer));
  const Shape& s = kv.k.shape();
  const int64_t rows = length_ + t;
  Tensor k = Tensor::empty({s[0], s[1], rows, s[3]}), v = Tensor::empty({s[0], s[1], rows, s[3]});
  copy_rows(kv.k.data<float>(), capacity_, 0, k.data<float>(), rows, 0, rows, s[0] * s[1], s[3]);
  copy_rows(kv.v.data<float>(), capacity_, 0, v.data<float>(), rows, 0, rows, s[0] * s[1], s[3]);
  return {k, v};
}

void KVCache::advance(int64_t t) {
  LOOM_CHECK(length_ + t <= capacity_, "KVCache: ", length_, " + ", t, " tokens exceed the capacity ", capacity_);
  length_ += t;
}

}  // namespace loom::nn
