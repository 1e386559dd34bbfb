// The fused decode step: the description checked once (DecodeStep), the token and caches per call.
#include "ops/decode_step.h"

#include "backends/backend.h"
#include "backends/cpu/decode_step.h"

namespace loom::ops {
namespace {

constexpr const char* kOp = "decode_step";

// "layers.3.w2" for messages about layer 3's w2.
std::string where(size_t layer, const char* what) { return str("layers.", layer, ".", what); }

// The layer's matrices with their names and the shape [rows, cols] each must have.
struct MatrixSlot {
  const char* name;
  const quant::QuantizedMatrix* matrix;
  int64_t rows, cols;
};
std::vector<MatrixSlot> matrices(const DecodeStepLayer& l, int64_t C, int64_t H, int64_t Hkv, int64_t D, int64_t F) {
  return {{"q_proj", l.q_proj.get(), H * D, C},        {"k_proj", l.k_proj.get(), Hkv * D, C},
          {"v_proj", l.v_proj.get(), Hkv * D, C},      {"output_proj", l.output_proj.get(), C, H * D},
          {"w1", l.w1.get(), F, C},                    {"w3", l.w3.get(), F, C},
          {"w2", l.w2.get(), C, F}};
}

void check_vector(const Tensor& t, int64_t C, const std::string& name) {
  LOOM_CHECK(t.defined(), kOp, ": ", name, " is undefined");
  require_cpu(kOp, {&t});
  LOOM_CHECK(t.dtype() == DType::F32 && t.ndim() == 1 && t.size(0) == C, kOp, ": ", name, " is ", t.describe(),
             "; expected f32 [", C, "] (C=", C, ")");
}

}  // namespace

std::string DecodeStep::unsupported(const DecodeStepWeights& w) {
  if (w.num_heads > 0 && w.token_embeddings.defined() && w.token_embeddings.ndim() == 2) {
    const int64_t C = w.token_embeddings.size(1);
    if (C % w.num_heads == 0 && (C / w.num_heads) % 8 != 0) {
      return str("head dim ", C / w.num_heads, " is not a multiple of 8");
    }
  }
  auto without_kernels = [](const quant::QuantizedMatrix* m) { return m && !quant::has_matmul_kernels(m->type()); };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    for (const MatrixSlot& s : matrices(w.layers[i], 0, 0, 0, 0, 0)) {
      if (without_kernels(s.matrix)) {
        return str(where(i, s.name), " is ", quant::quant_type_name(s.matrix->type()), ", which has no integer kernels");
      }
    }
  }
  if (without_kernels(w.head.get())) {
    return str("the head is ", quant::quant_type_name(w.head->type()), ", which has no integer kernels");
  }
  return "";
}

DecodeStep::DecodeStep(DecodeStepWeights weights) : weights_(std::move(weights)) {
  const DecodeStepWeights& w = weights_;
  const Tensor& emb = w.token_embeddings;
  LOOM_CHECK(emb.defined(), kOp, ": token_embeddings is undefined");
  require_cpu(kOp, {&emb});
  LOOM_CHECK(emb.dtype() == DType::F32 && emb.ndim() == 2 && emb.size(0) > 0 && emb.size(1) > 0, kOp,
             ": token_embeddings is ", emb.describe(), "; expected f32 [V, C]");
  const int64_t V = emb.size(0), C = emb.size(1), H = w.num_heads, Hkv = w.num_kv_heads;
  LOOM_CHECK(H > 0 && Hkv > 0 && H % Hkv == 0 && C % H == 0, kOp, ": num_heads=", H, " and num_kv_heads=", Hkv,
             " must be > 0, with num_heads a multiple of num_kv_heads and dividing C=", C);
  LOOM_CHECK(w.context_length > 0, kOp, ": context_length=", w.context_length, " must be > 0");
  LOOM_CHECK(!w.layers.empty(), kOp, ": no layers");
  if (std::string why = unsupported(w); !why.empty()) LOOM_FAIL(kOp, ": ", why);
  const int64_t D = C / H;
  const int64_t F = w.layers[0].w1 ? w.layers[0].w1->rows() : 0;

  auto kernel = std::make_unique<cpu::DecodeModel>();
  kernel->C = C, kernel->H = H, kernel->Hkv = Hkv, kernel->D = D, kernel->F = F, kernel->V = V;
  kernel->token_embeddings = emb.data<float>();
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecodeStepLayer& l = w.layers[i];
    for (const MatrixSlot& s : matrices(l, C, H, Hkv, D, F)) {
      LOOM_CHECK(s.matrix != nullptr, kOp, ": ", where(i, s.name), " is missing");
      LOOM_CHECK(s.matrix->rows() == s.rows && s.matrix->cols() == s.cols, kOp, ": ", where(i, s.name), " is [",
                 s.matrix->rows(), ", ", s.matrix->cols(), "]; expected [", s.rows, ", ", s.cols, "] (C=", C, ", H=", H,
                 ", Hkv=", Hkv, ", D=", D, ", F=", F, ")");
    }
    check_vector(l.attn_norm, C, where(i, "attn_norm"));
    check_vector(l.ffn_norm, C, where(i, "ffn_norm"));
    LOOM_CHECK(l.rope.defined() && l.rope.sin.defined(), kOp, ": ", where(i, "rope"), " has no cos/sin tables");
    for (const Tensor* t : {&l.rope.cos, &l.rope.sin}) {
      require_cpu(kOp, {t});
      LOOM_CHECK(t->dtype() == DType::F32 && t->ndim() == 2 && t->size(0) >= w.context_length && t->size(1) == D / 2,
                 kOp, ": ", where(i, "rope"), "'s table is ", t->describe(), "; expected f32 [>= ", w.context_length,
                 ", ", D / 2, "] (context_length ", w.context_length, ", D/2)");
    }
    cpu::DecodeLayer k;
    k.q_proj = l.q_proj.get(), k.k_proj = l.k_proj.get(), k.v_proj = l.v_proj.get();
    k.output_proj = l.output_proj.get(), k.w1 = l.w1.get(), k.w3 = l.w3.get(), k.w2 = l.w2.get();
    k.attn_norm = l.attn_norm.data<float>(), k.ffn_norm = l.ffn_norm.data<float>();
    k.attn_norm_eps = l.attn_norm_eps, k.ffn_norm_eps = l.ffn_norm_eps;
    k.rope_cos = l.rope.cos.data<float>(), k.rope_sin = l.rope.sin.data<float>();
    k.rope_interleaved = l.rope_style == RopeStyle::Interleaved;
    kernel->layers.push_back(k);
  }
  check_vector(w.final_norm, C, "final_norm");
  kernel->final_norm = w.final_norm.data<float>();
  kernel->final_norm_eps = w.final_norm_eps;
  LOOM_CHECK(w.head != nullptr, kOp, ": the head is missing");
  LOOM_CHECK(w.head->rows() == V && w.head->cols() == C, kOp, ": the head is [", w.head->rows(), ", ", w.head->cols(),
             "]; expected [", V, ", ", C, "] (V=", V, ", C=", C, ")");
  kernel->head = w.head.get();
  kernel_ = std::move(kernel);
}

DecodeStep::~DecodeStep() = default;

int64_t DecodeStep::head_dim() const { return kernel_->D; }

Tensor decode_step(const DecodeStep& step, int32_t token, int64_t position, const std::vector<Tensor>& k_cache,
                   const std::vector<Tensor>& v_cache) {
  const cpu::DecodeModel& m = *step.kernel_;
  const int64_t V = m.V, L = static_cast<int64_t>(m.layers.size()), context = step.weights_.context_length;
  LOOM_CHECK(token >= 0 && token < V, kOp, ": token id ", token, " is outside the vocabulary [0, ", V, ")");
  LOOM_CHECK(position >= 0 && position + 1 <= context, kOp, ": ", position, " cached + 1 new token exceed context_length ",
             context);
  LOOM_CHECK(static_cast<int64_t>(k_cache.size()) == L && static_cast<int64_t>(v_cache.size()) == L, kOp, ": ",
             k_cache.size(), " k and ", v_cache.size(), " v caches for ", L, " layers");
  const int64_t cap = k_cache[0].defined() && k_cache[0].ndim() == 4 ? k_cache[0].size(2) : 0;
  std::vector<float*> k(static_cast<size_t>(L)), v(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    for (const Tensor* t : {&k_cache[static_cast<size_t>(l)], &v_cache[static_cast<size_t>(l)]}) {
      LOOM_CHECK(t->defined(), kOp, ": layer ", l, "'s cache is undefined");
      require_cpu(kOp, {t});
      LOOM_CHECK(t->dtype() == DType::F32 && t->ndim() == 4 && t->size(0) == 1 && t->size(1) == m.Hkv &&
                     t->size(2) == cap && t->size(3) == m.D,
                 kOp, ": layer ", l, "'s cache is ", t->describe(), "; expected a batch-1 cache f32 [1, ", m.Hkv, ", ",
                 cap, ", ", m.D, "] (Hkv=", m.Hkv, ", D=", m.D, ", layer 0's capacity ", cap, ")");
    }
    k[static_cast<size_t>(l)] = k_cache[static_cast<size_t>(l)].data<float>();
    v[static_cast<size_t>(l)] = v_cache[static_cast<size_t>(l)].data<float>();
  }
  LOOM_CHECK(position + 1 <= cap, kOp, ": ", position, " cached + 1 new token exceed the caches' capacity ", cap);
  Tensor logits = Tensor::empty({1, 1, V});
  cpu::decode_step(m, token, position, cap, k.data(), v.data(), logits.data<float>());
  return logits;
}

Tensor paged_decode_step(const DecodeStep& step, std::span<const int32_t> tokens, const PagedRows& rows,
                         std::span<const int64_t> logit_rows, const std::vector<Tensor>& k_cache,
                         const std::vector<Tensor>& v_cache) {
  constexpr const char* op = "paged_decode_step";
  const cpu::DecodeModel& m = *step.kernel_;
  const int64_t V = m.V, L = static_cast<int64_t>(m.layers.size()), context = step.weights_.context_length;
  const int64_t R = rows.size(), n = static_cast<int64_t>(logit_rows.size());
  LOOM_CHECK(static_cast<int64_t>(tokens.size()) == R, op, ": ", tokens.size(), " tokens for ", R, " rows");
  LOOM_CHECK(static_cast<int64_t>(k_cache.size()) == L && static_cast<int64_t>(v_cache.size()) == L, op, ": ",
             k_cache.size(), " k and ", v_cache.size(), " v caches for ", L, " layers");
  for (int64_t r = 0; r < R; ++r) {
    const int32_t token = tokens[static_cast<size_t>(r)];
    const int64_t pos = rows.positions[static_cast<size_t>(r)];
    LOOM_CHECK(token >= 0 && token < V, op, ": row ", r, "'s token id ", token, " is outside the vocabulary [0, ", V, ")");
    LOOM_CHECK(pos >= 0 && pos < context, op, ": row ", r, "'s position ", pos, " is outside the context [0, ",
               context, ")");
  }
  std::vector<bool> seen(static_cast<size_t>(R), false);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = logit_rows[static_cast<size_t>(i)];
    LOOM_CHECK(r >= 0 && r < R && !seen[static_cast<size_t>(r)], op, ": logit row ", r,
               " is outside the step's rows [0, ", R, ") or named twice");
    seen[static_cast<size_t>(r)] = true;
  }
  Tensor logits = Tensor::empty({n, V});
  if (R == 0) return logits;
  const std::vector<const int32_t*> tables = paged_row_tables(op, k_cache[0], v_cache[0], m.H, rows);
  const Shape shape = k_cache[0].shape();
  LOOM_CHECK(shape[1] == m.Hkv && shape[3] == m.D, op, ": the caches are ", k_cache[0].describe(),
             "; expected f32 [NB, ", m.Hkv, ", S, ", m.D, "] (Hkv, D)");
  std::vector<float*> k(static_cast<size_t>(L)), v(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    for (const Tensor* t : {&k_cache[static_cast<size_t>(l)], &v_cache[static_cast<size_t>(l)]}) {
      LOOM_CHECK(t->defined(), op, ": layer ", l, "'s cache is undefined");
      require_cpu(op, {t});
      LOOM_CHECK(t->dtype() == DType::F32 && t->shape() == shape, op, ": layer ", l, "'s cache is ", t->describe(),
                 "; expected layer 0's ", k_cache[0].describe());
    }
    k[static_cast<size_t>(l)] = k_cache[static_cast<size_t>(l)].data<float>();
    v[static_cast<size_t>(l)] = v_cache[static_cast<size_t>(l)].data<float>();
  }
  cpu::PagedAttentionProblem p;
  p.R = R, p.H = m.H, p.Hkv = m.Hkv, p.D = m.D, p.S = shape[2], p.NB = shape[0];
  p.positions = rows.positions.data();
  p.tables = tables.data();
  cpu::paged_decode_step(m, p, tokens.data(), logit_rows.data(), n, k.data(), v.data(), logits.data<float>());
  return logits;
}

}  // namespace loom::ops
