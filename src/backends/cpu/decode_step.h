// A Llama-style decoder's single-token decode step with quantized weights, fused into one parallel
// region: the kernel behind ops::decode_step (ops/decode_step.h), which validates its arguments.
//
// Legend: C d_model, H query heads, Hkv k/v heads, D head dim, F d_ff, V vocab, L layers, P the new
// token's position (the cache's length), cap the cache's capacity.
//
// Why: a decode step of a small model is ~150 small matmuls and as many norms, RoPEs and attentions,
// each a few microseconds. Run op by op (llama::TransformerLM::forward_cached), every op forks and joins
// its own OpenMP team (SmolLM2-135M: ~860 regions per token), which costs as much as the weights' reading
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

#include <cstdint>
#include <vector>

#include "backends/cpu/paged_attention.h"
#include "quant/qmatmul.h"

namespace loom::cpu {

// One pre-norm block: x += output_proj(attention(rope(q), rope(k), v)) of rms_norm(x), then
// x += w2(swiglu(w1 x_n, w3 x_n)) of rms_norm(x).
struct DecodeLayer {
  const quant::QuantizedMatrix* q_proj = nullptr;       // [H*D, C]
  const quant::QuantizedMatrix* k_proj = nullptr;       // [Hkv*D, C]
  const quant::QuantizedMatrix* v_proj = nullptr;       // [Hkv*D, C]
  const quant::QuantizedMatrix* output_proj = nullptr;  // [C, H*D]
  const quant::QuantizedMatrix* w1 = nullptr;           // [F, C] gate
  const quant::QuantizedMatrix* w3 = nullptr;           // [F, C] up
  const quant::QuantizedMatrix* w2 = nullptr;           // [C, F] down
  const float* attn_norm = nullptr;                     // [C] the attention's RMSNorm gain
  const float* ffn_norm = nullptr;                      // [C] the SwiGLU's RMSNorm gain
  float attn_norm_eps = 0.0f, ffn_norm_eps = 0.0f;
  const float* rope_cos = nullptr;                      // [positions, D/2] cos(p * theta^(-2i/D))
  const float* rope_sin = nullptr;                      // [positions, D/2]
  bool rope_interleaved = true;                         // pairs (x[2i], x[2i+1]); else (x[i], x[i + D/2])
};

// The whole decoder, batch 1. D a multiple of 8, H a multiple of Hkv; C and F multiples of the
// matrices' block sizes (as quantized_matmul_rows needs).
struct DecodeModel {
  int64_t C = 0, H = 0, Hkv = 0, D = 0, F = 0, V = 0;
  const float* token_embeddings = nullptr;  // [V, C]
  std::vector<DecodeLayer> layers;          // L
  const float* final_norm = nullptr;        // [C]
  float final_norm_eps = 0.0f;
  const quant::QuantizedMatrix* head = nullptr;  // [V, C]
};

// One token at position P: logits [V] written, and its rotated key and value written to row P of every
// layer's cache. k_cache[l], v_cache[l]: layer l's [Hkv, cap, D] (rows [0, P) filled), P < cap, and P
// below the RoPE tables' rows. Checks nothing: ops::decode_step does.
void decode_step(const DecodeModel& model, int32_t token, int64_t P, int64_t cap, float* const* k_cache,
                 float* const* v_cache, float* logits);

// The step over R rows of any number of sequences at once (batched serving, ops::paged_decode_step): row
// r is token tokens[r] at rows.positions[r] of the sequence whose blocks rows.tables[r] lists, its keys
// and values written to that position's slot of the paged caches k_cache[l], v_cache[l] [NB, Hkv, S, D]
// (rows.H and rows.D must be the model's; rows.R the rows). logits [n, V]: the logits of rows
// logit_rows[0..n).
//
// One team again, every matrix read once per step for all rows, but no fixed shares: each phase (the
// q/k/v heads, the attention's (row, head) pairs a few at a time, chunks of 64-256 rows of output_proj,
// w1/w3 and w2 (about four a thread), of 256 rows of the head) is a list of chunks the threads claim, each
// first a contiguous range of its own (core/parallel.h ClaimedPhases), so on a
// busy machine a descheduled thread delays only a chunk it holds, not every barrier of the step. Each
// row's arithmetic is the op-by-op paged pass's (nn::paged_decoder_forward with its weights quantized):
// the same RMSNorm, activation quantization, quantized_matmul_rows over ranges starting on multiples of
// 8 rows, RoPE from the same table rows, ops::paged_attention's per-(row, head) kernel
// (paged_attention_heads), SwiGLU and adds; so a row's logits are bitwise those of that pass, which are
// the same whatever other rows share the step, and whichever thread computes a chunk. The rows'
// normed and quantized activations are computed by every thread for itself when the rows are few, else
// once, a row a chunk, in a phase of their own.
void paged_decode_step(const DecodeModel& model, const PagedAttentionProblem& rows, const int32_t* tokens,
                       const int64_t* logit_rows, int64_t n, float* const* k_cache, float* const* v_cache, float* logits);

}  // namespace loom::cpu
