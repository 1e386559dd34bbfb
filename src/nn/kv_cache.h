// The key/value cache of incremental decoding: per layer, the RoPE-rotated keys and the values of every
// token seen so far, so each new token costs one row of attention instead of a full forward pass.
#pragma once

#include <vector>

#include "core/tensor.h"
#include "nn/decode_cache.h"

namespace loom::nn {

struct LayerKV {
  Tensor k, v;  // [B, Hkv, capacity, D] (k/v heads); rows [0, length) are filled
};

class KVCache : public DecodeCache {
 public:
  KVCache(int64_t num_layers, int64_t batch, int64_t num_heads, int64_t capacity, int64_t head_dim);

  int64_t length() const override { return length_; }
  int64_t capacity() const override { return capacity_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  LayerKV& layer(int64_t i) { return layers_[static_cast<size_t>(i)]; }
  // Appends new keys/values [B, H, t, D] to layer i's rows [length, length + t).
  void write(int64_t layer, const Tensor& k, const Tensor& v);
  // Layer i's filled rows [0, length + t) as contiguous [B, H, length + t, D] copies.
  std::pair<Tensor, Tensor> read(int64_t layer, int64_t t) const;
  // Marks t more rows as filled (after every layer wrote them).
  void advance(int64_t t);
  void clear() override { length_ = 0; }

 private:
  std::vector<LayerKV> layers_;
  int64_t length_ = 0, capacity_;
};

}  // namespace loom::nn
