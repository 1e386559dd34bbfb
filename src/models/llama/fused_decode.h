// The Llama's single-token decode step with quantized weights, fused into one parallel region.
//
// Legend: C d_model, H query heads, Hkv k/v heads, D head dim, F d_ff, V vocab, P the new token's
// position (the cache's length).
//
// Why: a decode step of a small model is ~150 small matmuls and as many norms, RoPEs and attentions,
// each a few microseconds. Run op by op (TransformerLM::forward_cached), every op forks and joins its
// own OpenMP team (SmolLM2-135M: ~860 regions per token), which costs as much as the weights' reading
// and collapses when OpenMP's threads sleep between regions (OMP_WAIT_POLICY=passive) or the machine
// is busy. Here one team (core/parallel.h parallel_team) runs the whole step, with 5 barriers a layer:
//   1. every thread: x_n = rms_norm(x) and its 8-bit quantization (C values: cheaper to repeat than to
//      share); its share of the q/k/v heads (the three matrices as one list of H + 2 Hkv heads): q
//      rotated in place, k rotated into the cache's row P, v copied there.
//   2. its share of the H query heads: attention of q_h over cache rows [0, P], by the flash kernel the
//      op-by-op path runs, reading the cache in place (that path first copies the cache out, per layer).
//   3. every thread quantizes the attention output; its share of output_proj's rows, added to x.
//   4. every thread: rms_norm + quantization; its share of the F rows of w1 and w3, and swiglu on them.
//   5. every thread quantizes h [F]; its share of w2's rows, added to x.
// then the final norm and its share of the head's V rows. Shares are contiguous and start on multiples
// of 8 rows (the kernels' interleaved groups), so every matmul output is bit for bit the op-by-op
// path's, and so are the norms, RoPE, attention, SwiGLU and residual adds (the same kernels on the same
// rows): the logits are the op-by-op path's bits, which are the full forward's. (Bitwise matters here:
// the 8-bit activation rounding after each op turns a last-bit difference, e.g. another summation
// order in the attention, into logits ~1% apart now and then, and a different greedy text.)
#pragma once

#include <string>

#include "nn/kv_cache.h"
#include "models/llama/model.h"

namespace loom::llama {

// Empty when fused_decode_step can run `model`; otherwise why not (e.g. "layers.0.ffn.w2.weight is not
// held quantized"): every Linear of the layers and the head held quantized, no biases, no tensor
// parallelism, RoPE, f32 embedding and norms, and a head dim that is a multiple of 8.
std::string fused_decode_unsupported(const TransformerLM& model);

// One token at position P = cache.length() (batch 1): returns its logits [1, 1, V] and writes its keys
// and values to the cache's row P of every layer; the caller advances the cache. Checks the token and
// the room left in the cache; the model must be supported (fused_decode_unsupported empty).
Tensor fused_decode_step(const TransformerLM& model, int32_t token, nn::KVCache& cache);

}  // namespace loom::llama
