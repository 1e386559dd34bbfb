#include "ops/paged_attention.h"

#include <cmath>

#include "backends/backend.h"
#include "backends/cpu/paged_attention.h"

namespace loom::ops {

namespace {

// Checks the caches and the rows; returns the kernel's problem (tables point into `tables`).
cpu::PagedAttentionProblem problem(const char* op, const Tensor& k_cache, const Tensor& v_cache, int64_t H,
                                   const PagedRows& rows, std::vector<const int32_t*>& tables) {
  check_dtype(k_cache, DType::F32, op, "k_cache");
  check_dtype(v_cache, DType::F32, op, "v_cache");
  check_ndim(k_cache, 4, op, "k_cache");
  LOOM_CHECK(k_cache.shape() == v_cache.shape(), op, ": k_cache ", k_cache.describe(), " and v_cache ",
             v_cache.describe(), " differ");
  require_cpu(op, {&k_cache, &v_cache});
  cpu::PagedAttentionProblem p;
  p.NB = k_cache.size(0);
  p.Hkv = k_cache.size(1);
  p.S = k_cache.size(2);
  p.D = k_cache.size(3);
  p.H = H;
  p.R = rows.size();
  LOOM_CHECK(H > 0 && H % p.Hkv == 0, op, ": ", H, " query heads are not a multiple of the cache's ", p.Hkv,
             " k/v heads");
  LOOM_CHECK(rows.tables.size() == rows.positions.size(), op, ": ", rows.positions.size(), " positions but ",
             rows.tables.size(), " block tables");
  tables.resize(rows.tables.size());
  for (int64_t r = 0; r < p.R; ++r) {
    const int64_t pos = rows.positions[static_cast<size_t>(r)];
    const std::vector<int32_t>* table = rows.tables[static_cast<size_t>(r)];
    LOOM_CHECK(table != nullptr && pos >= 0 && pos / p.S < static_cast<int64_t>(table->size()), op, ": row ", r,
               " at position ", pos, " needs block ", pos / p.S, " of its table, which has ",
               table ? table->size() : 0, " blocks");
    for (int64_t b = 0; b <= pos / p.S; ++b) {
      const int32_t id = (*table)[static_cast<size_t>(b)];
      LOOM_CHECK(id >= 0 && id < p.NB, op, ": row ", r, " names block ", id, ", outside the cache's ", p.NB, " blocks");
    }
    tables[static_cast<size_t>(r)] = table->data();
  }
  p.positions = rows.positions.data();
  p.tables = tables.data();
  return p;
}

}  // namespace

std::vector<const int32_t*> paged_row_tables(const char* op, const Tensor& k_cache, const Tensor& v_cache, int64_t H,
                                             const PagedRows& rows) {
  std::vector<const int32_t*> tables;
  problem(op, k_cache, v_cache, H, rows, tables);
  return tables;
}

void paged_kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const PagedRows& rows) {
  std::vector<const int32_t*> tables;
  const cpu::PagedAttentionProblem p = problem("paged_kv_write", k_cache, v_cache, k_cache.size(1), rows, tables);
  for (const Tensor* t : {&k, &v}) {
    check_dtype(*t, DType::F32, "paged_kv_write", "k/v");
    require_cpu("paged_kv_write", {t});
    LOOM_CHECK(t->shape() == Shape({p.R, p.Hkv, p.D}), "paged_kv_write: k/v ", t->describe(), " should be [",
               p.R, ", ", p.Hkv, ", ", p.D, "] (rows, k/v heads, head dim)");
  }
  cpu::paged_kv_write(p, k.data<float>(), v.data<float>(), k_cache.data<float>(), v_cache.data<float>());
}

void paged_cache_write(Tensor& cache, const Tensor& x, const PagedRows& rows) {
  std::vector<const int32_t*> tables;
  const cpu::PagedAttentionProblem p = problem("paged_cache_write", cache, cache, cache.size(1), rows, tables);
  check_dtype(x, DType::F32, "paged_cache_write", "x");
  require_cpu("paged_cache_write", {&x});
  LOOM_CHECK(x.shape() == Shape({p.R, p.Hkv, p.D}), "paged_cache_write: x ", x.describe(), " should be [", p.R, ", ",
             p.Hkv, ", ", p.D, "] (rows, the cache's heads, its slot width)");
  cpu::paged_row_write(p, x.data<float>(), cache.data<float>());
}

Tensor paged_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const PagedRows& rows,
                       const PagedAttentionOptions& options) {
  check_dtype(q, DType::F32, "paged_attention", "q");
  check_ndim(q, 3, "paged_attention", "q");
  require_cpu("paged_attention", {&q});
  std::vector<const int32_t*> tables;
  cpu::PagedAttentionProblem p = problem("paged_attention", k_cache, v_cache, q.size(1), rows, tables);
  LOOM_CHECK(q.size(0) == p.R && q.size(2) == p.D, "paged_attention: q ", q.describe(), " should be [", p.R,
             ", H, ", p.D, "] (rows, heads, the cache's head dim)");
  LOOM_CHECK(options.value_dim >= 0 && options.value_dim <= p.D, "paged_attention: value_dim ", options.value_dim,
             " is outside [0, ", p.D, "] (0: the cache's head dim ", p.D, ")");
  LOOM_CHECK(options.scale >= 0 && std::isfinite(options.scale), "paged_attention: scale ", options.scale,
             " must be finite and >= 0 (0: 1/sqrt(D))");
  p.Dv = options.value_dim;
  p.scale = options.scale;
  Tensor out = Tensor::empty({p.R, q.size(1), p.value_dim()});
  cpu::paged_attention_forward(p, q.data<float>(), k_cache.data<float>(), v_cache.data<float>(), out.data<float>());
  return out;
}

}  // namespace loom::ops
