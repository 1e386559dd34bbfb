// CPU kernel for the attention of one new token against a KV cache (single-token decoding).
//
// Legend: n keys (the cached tokens and the new one), D q/k head dimension, Dv value head dimension.
//
// The flash kernels (attention.h) serve prefill and training: they pack K transposed per head so that
// Q K^T vectorises over a block of keys, which pays off over many query rows. Decoding has one query
// row per head, so that pack would be a copy of the whole cache per step for one pass over it. This
// kernel reads the cache's rows where they are ([n, D] row-major, any row stride): one dot product per
// key, an exact softmax over the n scores (max, exp, sum: all n fit in a scratch row), and the weighted
// sum of the value rows. It differs from the flash kernels only in the order of the f32 sums.
#pragma once

#include <cstdint>

namespace loom::cpu {

// out[Dv] = sum_j softmax_j(scale * q . k_j) v_j over keys j in [0, n), n >= 1.
//   q: [D]; key j at k + j * k_stride ([D]); value j at v + j * v_stride ([Dv]); scores: n floats of
//   scratch. out must not overlap the inputs.
void attention_decode_row(float* out, const float* q, const float* k, int64_t k_stride, const float* v,
                          int64_t v_stride, int64_t n, int64_t d, int64_t dv, float scale, float* scores);

// The same in double, one term at a time: the oracle of the kernel test.
void attention_decode_row_reference(float* out, const float* q, const float* k, int64_t k_stride, const float* v,
                                    int64_t v_stride, int64_t n, int64_t d, int64_t dv, float scale);

}  // namespace loom::cpu
