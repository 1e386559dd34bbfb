// The fused decode step (decode_step.h): one team of threads, 5 barriers a layer.
#include "backends/cpu/decode_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backends/cpu/activation.h"
#include "backends/cpu/attention.h"
#include "backends/cpu/norm.h"
#include "backends/cpu/rope.h"
#include "core/allocator.h"
#include "core/parallel.h"

namespace loom::cpu {

namespace {

// Memory the team's threads write side by side, a chunk of whole 64-byte lines each: zeroed, from loom's
// CPU allocator, whose blocks start on a line (core/allocator.h) and are reused from step to step. With
// each array rounded to whole lines (whole_lines), the chunks (a multiple of 16 outputs, of rows whose
// widths are multiples of 16 in the models served) never share a line, where std::vector's 16-byte
// alignment put every chunk's first and last outputs in lines the other thread wrote too, and each such
// line moved between the cores (bench/serve_step, SmolLM2 Q4_1, 2 threads, docs/serve.md).
template <class T>
class LineBuffer {
 public:
  explicit LineBuffer(int64_t n) : storage_(static_cast<size_t>(n) * sizeof(T), Device::cpu()) {
    std::memset(storage_.data(), 0, storage_.bytes());
  }
  T* data() const { return static_cast<T*>(storage_.data()); }

 private:
  Storage storage_;
};

constexpr size_t kLine = 64;

// n rounded up to whole 64-byte lines of T (float: 16, ActBlock: 4).
template <class T>
int64_t whole_lines(int64_t n) {
  constexpr int64_t per = static_cast<int64_t>(std::lcm(sizeof(T), kLine) / sizeof(T));
  return (n + per - 1) / per * per;
}

// A matmul phase's quantized rows: their blocks, and (or nullptr) the AMX kernels' copy of them
// (quant::pack_activation_tiles).
struct Acts {
  const quant::ActBlock* blocks;
  const int8_t* tiles;
};

// The step's arrays the team shares, each on lines of its own (LineBuffer): with row widths that are
// multiples of 16, every chunk of columns (a multiple of 16) is whole lines. x [R, C] the residual
// stream; q [R, H*D]; kbuf, vbuf [R, Hkv*D] the new keys and values; y [R, H*D] the attention's output;
// o [R, C] a projection's output; g, u, h [R, F].
struct StepArrays {
  StepArrays(const DecodeModel& m, int64_t R)
      : lC(whole_lines<float>(R * m.C)), lQ(whole_lines<float>(R * m.H * m.D)), lK(whole_lines<float>(R * m.Hkv * m.D)),
        lF(whole_lines<float>(R * m.F)), memory(2 * lC + 2 * lQ + 2 * lK + 3 * lF) {}
  int64_t lC, lQ, lK, lF;
  LineBuffer<float> memory;
  float* x = memory.data();
  float* q = x + lC;
  float* kbuf = q + lQ;
  float* vbuf = kbuf + lK;
  float* y = vbuf + lK;
  float* o = y + lQ;
  float* g = o + lC;
  float* u = g + lF;
  float* h = u + lF;
};

}  // namespace

void decode_step(const DecodeModel& m, int32_t token, int64_t P, int64_t cap, float* const* k_cache,
                 float* const* v_cache, float* logits) {
  const int64_t C = m.C, H = m.H, Hkv = m.Hkv, D = m.D, F = m.F, V = m.V;
  const int64_t L = static_cast<int64_t>(m.layers.size());
  quant::best_kernel_path();  // resolved (LOOM_QUANT_KERNEL checked) before the region, which cannot throw

  const int threads = num_threads();
  const int64_t group = H / Hkv, half = D / 2;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));  // scaled_dot_product_attention's default
  // Shared between the team (StepArrays, one row; v goes straight into the cache).
  const StepArrays shared(m, 1);
  float *x = shared.x, *q = shared.q, *kbuf = shared.kbuf, *y = shared.y, *o = shared.o;
  float *g = shared.g, *u = shared.u, *h = shared.h;
  // Per thread: the normed row [C], its quantized blocks [levels * max(C, F) / 32] (levels: the
  // activation rounding's, resolved here because the team below cannot throw).
  const int64_t act_blocks = whole_lines<quant::ActBlock>(quant::activation_levels() * std::max(C, F) / 32);
  const int64_t lC = shared.lC;
  LineBuffer<float> xn(threads * lC);
  LineBuffer<quant::ActBlock> act(threads * act_blocks);
  std::memcpy(x, m.token_embeddings + token * C, static_cast<size_t>(C) * sizeof(float));

  parallel_team(threads, [&](Team& team) {
    const int r = team.rank();
    float* my_xn = xn.data() + r * lC;
    quant::ActBlock* my_act = act.data() + r * act_blocks;
    // out[n] for n in [n0, n1): row n of the matrix times this thread's quantized activations.
    auto rows = [&](const quant::QuantizedMatrix* w, int64_t n0, int64_t n1, float* out) {
      quant::quantized_matmul_rows(my_act, 1, *w, n0, n1, out, 0);
    };
    // Before a barrier: the first bytes of this thread's next share start loading during the wait.
    constexpr int64_t kPrefetchBytes = 4096;
    auto prefetch = [&](const quant::QuantizedMatrix* w, int64_t n0, int64_t n1) {
      quant::prefetch_matmul_rows(*w, n0, n1, kPrefetchBytes);
    };
    auto norm_and_quantize = [&](const float* gain, float eps, const float* in) {
      rms_norm_forward(my_xn, nullptr, in, gain, 1, C, eps);
      quant::quantize_activation_rows(my_xn, 1, C, my_act);
    };
    const auto [h0, h1] = team.share(H + 2 * Hkv);  // q, k, v heads
    const auto [a0, a1] = team.share(H);            // attention: query heads
    const auto [c0, c1] = team.share(C, 16);        // output_proj, w2 rows
    const auto [f0, f1] = team.share(F, 16);        // w1, w3 rows
    const auto [v0, v1] = team.share(V, 16);        // head rows
    // The q/k/v rows of heads [h0, h1) of layer b, by matrix.
    auto prefetch_qkv = [&](const DecodeLayer& b) {
      prefetch(b.q_proj, std::min(h0, H) * D, std::min(h1, H) * D);
      prefetch(b.k_proj, std::clamp(h0 - H, int64_t{0}, Hkv) * D, std::clamp(h1 - H, int64_t{0}, Hkv) * D);
      prefetch(b.v_proj, std::clamp(h0 - H - Hkv, int64_t{0}, Hkv) * D, std::clamp(h1 - H - Hkv, int64_t{0}, Hkv) * D);
    };
    for (int64_t li = 0; li < L; ++li) {
      const DecodeLayer& b = m.layers[static_cast<size_t>(li)];
      const float* cos = b.rope_cos + P * half;
      const float* sin = b.rope_sin + P * half;
      float* kc = k_cache[li];  // [Hkv, cap, D]
      float* vc = v_cache[li];

      // 1. q/k/v: heads [0, H) of q_proj, then Hkv of k_proj, then Hkv of v_proj.
      if (li == 0) prefetch_qkv(b);
      norm_and_quantize(b.attn_norm, b.attn_norm_eps, x);
      for (int64_t hd = h0; hd < h1; ++hd) {
        if (hd < H) {
          float* qh = q + hd * D;
          rows(b.q_proj, hd * D, (hd + 1) * D, q);
          rope_rotate_row(qh, qh, cos, sin, D, b.rope_interleaved, /*inverse=*/false);
        } else if (hd < H + Hkv) {
          const int64_t j = hd - H;
          rows(b.k_proj, j * D, (j + 1) * D, kbuf);
          rope_rotate_row(kc + (j * cap + P) * D, kbuf + j * D, cos, sin, D, b.rope_interleaved, false);
        } else {
          const int64_t j = hd - H - Hkv;
          rows(b.v_proj, j * D, (j + 1) * D, vc + j * cap * D + P * D - j * D);
        }
      }
      team.barrier();
      // 2. attention of each query head over the cache's rows [0, P] (output_proj's rows load meanwhile).
      prefetch(b.output_proj, c0, c1);
      // The flash kernel the op-by-op path runs, on one query row, with the cache's rows read in place
      // (no copy of the cache per step): bit for bit that path's attention (the 8-bit quantization of
      // the activations after it turns any other summation order into visibly different logits).
      for (int64_t hd = a0; hd < a1; ++hd) {
        const int64_t j = hd / group;
        AttentionProblem ap;
        ap.tq = 1;
        ap.tk = P + 1;
        ap.d = ap.dv = D;
        ap.scale = scale;
        ap.causal = true;
        ap.q = ap.out = {D, 0, D};
        ap.k = ap.v = {cap * D, 0, D};
        float lse;
        flash_attention_forward(ap, q + hd * D, kc + j * cap * D, vc + j * cap * D, y + hd * D, &lse);
      }
      team.barrier();
      // 3. x += output_proj(y).
      quant::quantize_activation_rows(y, 1, C, my_act);
      rows(b.output_proj, c0, c1, o);
      for (int64_t n = c0; n < c1; ++n) x[n] = x[n] + o[n];
      prefetch(b.w1, f0, f1);
      prefetch(b.w3, f0, f1);
      team.barrier();
      // 4. h = swiglu(w1 x_n, w3 x_n).
      norm_and_quantize(b.ffn_norm, b.ffn_norm_eps, x);
      rows(b.w1, f0, f1, g);
      rows(b.w3, f0, f1, u);
      swiglu_forward(h + f0, g + f0, u + f0, f1 - f0);
      prefetch(b.w2, c0, c1);
      team.barrier();
      // 5. x += w2 h.
      quant::quantize_activation_rows(h, 1, F, my_act);
      rows(b.w2, c0, c1, o);
      for (int64_t n = c0; n < c1; ++n) x[n] = x[n] + o[n];
      if (li + 1 < L) {
        prefetch_qkv(m.layers[static_cast<size_t>(li + 1)]);
      } else {
        prefetch(m.head, v0, v1);
      }
      team.barrier();
    }
    norm_and_quantize(m.final_norm, m.final_norm_eps, x);
    rows(m.head, v0, v1, logits);
  });
}

}  // namespace loom::cpu

namespace loom::cpu {

void paged_decode_step(const DecodeModel& m, const PagedAttentionProblem& p, const int32_t* tokens,
                       const int64_t* logit_rows, int64_t n, float* const* k_cache, float* const* v_cache,
                       float* logits) {
  const int64_t C = m.C, H = m.H, Hkv = m.Hkv, D = m.D, F = m.F, V = m.V, R = p.R;
  const int64_t L = static_cast<int64_t>(m.layers.size()), half = D / 2;
  // Resolved (LOOM_QUANT_KERNEL checked) before the region, which cannot throw.
  const bool amx = quant::best_kernel_path() == quant::KernelPath::Amx;
  const int64_t levels = quant::activation_levels();
  // Up to this many rows every thread normalizes and quantizes them all for itself: repeating a few rows
  // costs less than the phase that sharing them needs (a single decoding sequence is the case).
  constexpr int64_t kOwnRows = 2;
  const int threads = num_threads();
  // Rows of W per chunk: a multiple of 16 (the kernels' row blocks and 8-row groups), about four chunks
  // a thread, between 64 and 256 rows. Long chunks are fewer claims and kernel calls (bench/serve_step,
  // 2 threads, SmolLM2 Q4_1, interleaved: 64 -> 256 rows, R = 1 2.63 -> 2.26 ms, R = 16 9.28 -> 8.58 ms
  // when one counter handed the chunks out alternately; 32 -> 64 had gained ~5% too); since each thread
  // takes a contiguous home range (ClaimedPhases), four a thread rather than two balance the phases'
  // ends better without breaking the runs of weights read in order (R = 16 13.1 -> 12.1 ms, R = 1 2.78
  // -> 2.68; the 88M Llama 8.85 -> 8.38 and 1.22 -> 1.14; eight a thread, down to 32 rows, no better);
  // and many threads still share a matrix, so a thread descheduled while holding one delays the step little.
  auto chunk_rows = [threads](int64_t N) {
    return std::clamp<int64_t>(N / (4 * static_cast<int64_t>(threads)) / 16 * 16, 64, 256);
  };
  constexpr int64_t kHeadChunk = 256;
  const int64_t chunk_c = chunk_rows(C), chunk_f = chunk_rows(F);

  // Shared between the team: StepArrays, and shared_act the shared rows' quantized blocks.
  const StepArrays shared(m, R);
  float *x = shared.x, *q = shared.q, *kbuf = shared.kbuf, *vbuf = shared.vbuf, *y = shared.y, *o = shared.o;
  float *g = shared.g, *u = shared.u, *h = shared.h;
  const int64_t blocks = levels * std::max(C, F) / 32;
  LineBuffer<quant::ActBlock> shared_act(R > kOwnRows ? R * blocks : 0);
  // On the AMX path, the shared rows' copy that its kernels read (quant::pack_activation_tiles), made
  // row by row as the rows are quantized: each matmul phase's chunks all read it.
  const bool tiled = amx && R > kOwnRows;
  LineBuffer<int8_t> shared_tiles(tiled ? quant::activation_tile_bytes(levels * R, std::max(C, F)) : 0);
  // Per thread: a normed row [C]; its own quantized rows (up to kOwnRows); attention's scratch for
  // kHeadsTogether heads, scores [max position + 1] and acc [D] each.
  int64_t max_pos = 0;
  for (int64_t r = 0; r < R; ++r) max_pos = std::max(max_pos, p.positions[r]);
  const int64_t own_blocks = whole_lines<quant::ActBlock>(kOwnRows * blocks);
  const int64_t scratch = whole_lines<float>(C + kHeadsTogether * (max_pos + 1 + D));
  LineBuffer<float> per_thread(threads * scratch);
  LineBuffer<quant::ActBlock> own_act(threads * own_blocks);
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(x + r * C, m.token_embeddings + static_cast<int64_t>(tokens[r]) * C, static_cast<size_t>(C) * sizeof(float));
  }
  // Phases a layer: q/k/v, attention, output_proj, w1/w3, w2, and before each of the four matmuls' one
  // that quantizes the rows when they are shared; then the head's two.
  ClaimedPhases phases(9 * L + 2, threads);
  // Items of ~1 µs or less (attention's (row, head) pairs at short contexts, a row to quantize) are
  // claimed a few at a time, so that the claims (an atomic on a line the cores share) stay rare, with
  // still `claims` claims a thread to balance.
  auto per_claim = [threads](int64_t items, int64_t claims) {
    return std::max<int64_t>(1, items / (claims * static_cast<int64_t>(threads)));
  };
  // Attention's items: (row, up to kHeadsTogether query heads of one k/v head), computed side by side.
  const int64_t group = H / Hkv, per_group = (group + kHeadsTogether - 1) / kHeadsTogether;
  const int64_t head_chunks = Hkv * per_group;
  const int64_t heads_per_claim = per_claim(R * head_chunks, 8);
  // [c * size, min(total, (c + 1) * size)): chunk c of `total` items.
  auto span = [](int64_t c, int64_t size, int64_t total) {
    return std::pair<int64_t, int64_t>{c * size, std::min(total, (c + 1) * size)};
  };
  auto chunks_of = [](int64_t total, int64_t size) { return (total + size - 1) / size; };

  parallel_team(threads, [&](Team& team) {
    const int t = team.rank();
    float* my_xn = per_thread.data() + t * scratch;
    float* my_scores = my_xn + C;
    float* my_acc = my_scores + kHeadsTogether * (max_pos + 1);
    quant::ActBlock* my_act = own_act.data() + t * own_blocks;
    int64_t phase = 0;
    auto nothing = [] {};
    // A matmul phase over `chunks` chunks that reads the quantized rows [M, K] of row(i, scratch), i in
    // [0, M): each thread that takes part quantizes them all for itself (prepared before its first
    // chunk), or a phase before quantizes one shared copy (and its tiles), a few rows a chunk.
    // chunk(acts, c) passes acts to mm below.
    auto matmul_phase = [&](int64_t M, int64_t K, auto&& row, int64_t chunks, auto&& chunk) {
      const int64_t stride = levels * K / 32;
      if (M > kOwnRows) {
        const int64_t rows_per_claim = per_claim(M, 4);
        phases.run(phase++, chunks_of(M, rows_per_claim), t, nothing, [&](int64_t c) {
          const auto [i0, i1] = span(c, rows_per_claim, M);
          for (int64_t i = i0; i < i1; ++i) quant::quantize_activation_rows(row(i, my_xn), 1, K, shared_act.data() + i * stride);
          if (tiled) quant::pack_activation_tiles(shared_act.data(), levels * i0, levels * i1, K, shared_tiles.data());
        });
        const Acts acts{shared_act.data(), tiled ? shared_tiles.data() : nullptr};
        phases.run(phase++, chunks, t, nothing, [&](int64_t c) { chunk(acts, c); });
      } else {
        ++phase;  // the shared quantization's phase, unused: every thread numbers the phases alike
        auto prepare = [&] {
          for (int64_t i = 0; i < M; ++i) quant::quantize_activation_rows(row(i, my_xn), 1, K, my_act + i * stride);
        };
        phases.run(phase++, chunks, t, prepare, [&](int64_t c) { chunk(Acts{my_act, nullptr}, c); });
      }
    };
    // y[m * ldy + n] for n in [n0, n1) and the M rows of acts.
    auto mm = [](const Acts& acts, int64_t M, const quant::QuantizedMatrix& w, int64_t n0, int64_t n1, float* y, int64_t ldy) {
      quant::quantized_matmul_rows(acts.blocks, M, w, n0, n1, y, ldy, quant::KernelPath::Auto,
                                   quant::ActivationRounding::Default, acts.tiles);
    };
    auto normed = [&](const float* gain, float eps, const int64_t* which) {
      return [=](int64_t i, float* out) {
        rms_norm_forward(out, nullptr, x + (which ? which[i] : i) * C, gain, 1, C, eps);
        return static_cast<const float*>(out);
      };
    };
    auto plain = [](const float* base, int64_t K) {
      return [=](int64_t i, float*) { return base + i * K; };
    };
    for (int64_t li = 0; li < L; ++li) {
      const DecodeLayer& b = m.layers[static_cast<size_t>(li)];
      float* kc = k_cache[li];  // [NB, Hkv, S, D]
      float* vc = v_cache[li];

      // 1. q/k/v of every row, a head a chunk: heads [0, H) of q_proj, then Hkv of k_proj, then Hkv of
      // v_proj; k and v into each row's slot.
      matmul_phase(R, C, normed(b.attn_norm, b.attn_norm_eps, nullptr), H + 2 * Hkv, [&](const Acts& a, int64_t hd) {
        if (hd < H) {
          mm(a, R, *b.q_proj, hd * D, (hd + 1) * D, q, H * D);
          for (int64_t r = 0; r < R; ++r) {
            float* qh = q + r * H * D + hd * D;
            const int64_t P = p.positions[r];
            rope_rotate_row(qh, qh, b.rope_cos + P * half, b.rope_sin + P * half, D, b.rope_interleaved, false);
          }
        } else if (hd < H + Hkv) {
          const int64_t j = hd - H;
          mm(a, R, *b.k_proj, j * D, (j + 1) * D, kbuf, Hkv * D);
          for (int64_t r = 0; r < R; ++r) {
            const int64_t P = p.positions[r];
            rope_rotate_row(kc + paged_row_offset(p, r, j), kbuf + r * Hkv * D + j * D, b.rope_cos + P * half,
                            b.rope_sin + P * half, D, b.rope_interleaved, false);
          }
        } else {
          const int64_t j = hd - H - Hkv;
          mm(a, R, *b.v_proj, j * D, (j + 1) * D, vbuf, Hkv * D);
          for (int64_t r = 0; r < R; ++r) {
            std::memcpy(vc + paged_row_offset(p, r, j), vbuf + r * Hkv * D + j * D, static_cast<size_t>(D) * sizeof(float));
          }
        }
      });
      // 2. attention of each (row, query head) over its sequence's positions [0, P] (a row of a prompt
      // chunk reads the keys the chunk's earlier rows wrote in 1).
      phases.run(phase++, chunks_of(R * head_chunks, heads_per_claim), t, nothing, [&](int64_t c) {
        const auto [i0, i1] = span(c, heads_per_claim, R * head_chunks);
        // Chunk i % head_chunks of row i / head_chunks: k/v head g's query heads [h0, h1).
        auto first_head = [&](int64_t i) {
          const int64_t g = (i % head_chunks) / per_group, k = (i % head_chunks) % per_group;
          return g * group + k * kHeadsTogether;
        };
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t h0 = first_head(i), h1 = std::min(h0 + kHeadsTogether, (h0 / group + 1) * group);
          if (i + 1 < i1) paged_attention_prefetch(p, (i + 1) / head_chunks, first_head(i + 1), kc);
          paged_attention_heads(p, i / head_chunks, h0, h1, q, kc, vc, y, my_scores, my_acc);
        }
      });
      // 3. x += output_proj(y).
      matmul_phase(R, H * D, plain(y, H * D), chunks_of(C, chunk_c), [&](const Acts& a, int64_t c) {
        const auto [c0, c1] = span(c, chunk_c, C);
        mm(a, R, *b.output_proj, c0, c1, o, C);
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t i = c0; i < c1; ++i) x[r * C + i] = x[r * C + i] + o[r * C + i];
        }
      });
      // 4. h = swiglu(w1 x_n, w3 x_n).
      matmul_phase(R, C, normed(b.ffn_norm, b.ffn_norm_eps, nullptr), chunks_of(F, chunk_f), [&](const Acts& a, int64_t c) {
        const auto [f0, f1] = span(c, chunk_f, F);
        mm(a, R, *b.w1, f0, f1, g, F);
        mm(a, R, *b.w3, f0, f1, u, F);
        for (int64_t r = 0; r < R; ++r) swiglu_forward(h + r * F + f0, g + r * F + f0, u + r * F + f0, f1 - f0);
      });
      // 5. x += w2 h.
      matmul_phase(R, F, plain(h, F), chunks_of(C, chunk_c), [&](const Acts& a, int64_t c) {
        const auto [c0, c1] = span(c, chunk_c, C);
        mm(a, R, *b.w2, c0, c1, o, C);
        for (int64_t r = 0; r < R; ++r) {
          for (int64_t i = c0; i < c1; ++i) x[r * C + i] = x[r * C + i] + o[r * C + i];
        }
      });
    }
    // The head over the rows that want logits.
    matmul_phase(n, C, normed(m.final_norm, m.final_norm_eps, logit_rows), chunks_of(V, kHeadChunk),
                 [&](const Acts& a, int64_t c) {
      const auto [v0, v1] = span(c, kHeadChunk, V);
      mm(a, n, *m.head, v0, v1, logits, V);
    });
    (void)team;
  });
}

}  // namespace loom::cpu
