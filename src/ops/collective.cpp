#include "ops/collective.h"

#include <cstring>

#include "core/autograd.h"

namespace loom::ops {
namespace {

// x viewed as [outer, size(dim), inner].
struct Split {
  int64_t outer = 1, length = 0, inner = 1;
};
Split split_at(const Shape& s, int dim) {
  Split p;
  for (int i = 0; i < dim; ++i) p.outer *= s[i];
  p.length = s[dim];
  for (int i = dim + 1; i < s.ndim(); ++i) p.inner *= s[i];
  return p;
}

int checked_dim(const Tensor& x, int dim, const char* op) {
  LOOM_CHECK(x.defined(), op, ": x is undefined");
  check_dtype(x, DType::F32, op, "x");
  LOOM_CHECK(x.device().is_cpu(), op, ": collectives move CPU tensors, got ", x.describe());
  if (dim < 0) dim += x.ndim();
  LOOM_CHECK(dim >= 0 && dim < x.ndim(), op, ": dim ", dim, " out of range for ", x.describe());
  return dim;
}

Shape with_dim(Shape s, int dim, int64_t size) {
  s[dim] = size;
  return s;
}

}  // namespace

Tensor block_of(const Tensor& x, int dim, int64_t index, int64_t blocks) {
  dim = checked_dim(x, dim, "block_of");
  const Split p = split_at(x.shape(), dim);
  LOOM_CHECK(blocks > 0 && p.length % blocks == 0 && index >= 0 && index < blocks, "block_of: dimension ", dim, " of ",
             x.describe(), " does not split into ", blocks, " blocks (block ", index, ")");
  const int64_t n = p.length / blocks, row = n * p.inner;
  Tensor out = Tensor::empty(with_dim(x.shape(), dim, n));
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  for (int64_t o = 0; o < p.outer; ++o) {
    std::memcpy(dst + o * row, src + (o * p.length + index * n) * p.inner, static_cast<size_t>(row) * sizeof(float));
  }
  return out;
}

Tensor all_gather_values(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "all_gather");
  const int64_t g = group.size();
  if (g == 1) return x.detach();
  const Split p = split_at(x.shape(), dim);
  const int64_t row = p.length * p.inner;
  Tensor local = x.detach();
  std::vector<float> raw(static_cast<size_t>(g * x.numel()));  // [g, outer, row]
  group.comm->all_gather(local.data<float>(), x.numel(), raw.data(), group.ranks);
  Tensor out = Tensor::empty(with_dim(x.shape(), dim, p.length * g));  // [outer, g, row]
  float* dst = out.data<float>();
  for (int64_t r = 0; r < g; ++r) {
    for (int64_t o = 0; o < p.outer; ++o) {
      std::memcpy(dst + (o * g + r) * row, raw.data() + (r * p.outer + o) * row, static_cast<size_t>(row) * sizeof(float));
    }
  }
  return out;
}

Tensor reduce_scatter_values(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "reduce_scatter");
  const int64_t g = group.size();
  if (g == 1) return x.detach().clone();
  const Split p = split_at(x.shape(), dim);
  LOOM_CHECK(p.length % g == 0, "reduce_scatter: dimension ", dim, " of ", x.describe(), " does not divide by the group's ",
             g, " members");
  const int64_t n = p.length / g, row = n * p.inner, block = p.outer * row;
  std::vector<float> packed(static_cast<size_t>(x.numel()));  // [g, outer, row]
  const float* src = x.data<float>();
  for (int64_t r = 0; r < g; ++r) {
    for (int64_t o = 0; o < p.outer; ++o) {
      std::memcpy(packed.data() + r * block + o * row, src + (o * g + r) * row, static_cast<size_t>(row) * sizeof(float));
    }
  }
  Tensor out = Tensor::empty(with_dim(x.shape(), dim, n));
  group.comm->reduce_scatter_sum(packed.data(), block, out.data<float>(), group.ranks);
  return out;
}

Tensor StartedCollective::wait() {
  LOOM_ASSERT(finish_, "StartedCollective::wait: nothing started, or already waited for");
  auto f = std::move(finish_);
  finish_ = nullptr;
  return f();  // f and the buffers it holds go when this returns
}

StartedCollective& StartedCollective::operator=(StartedCollective&& other) {
  if (this != &other) {
    if (finish_) wait();
    finish_ = std::move(other.finish_);
    other.finish_ = nullptr;
  }
  return *this;
}

StartedCollective::~StartedCollective() {
  if (!finish_) return;
  try {
    wait();
  } catch (...) {  // the world failed: whoever waits next reports it
  }
}

StartedCollective start_all_gather_values(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "all_gather");
  const int64_t g = group.size();
  Tensor local = x.detach();
  if (g == 1) return StartedCollective([local] { return local; });
  const Split p = split_at(x.shape(), dim);
  const int64_t row = p.length * p.inner;
  const Shape shape = with_dim(x.shape(), dim, p.length * g);
  // [g, outer, row]: when outer is 1 (dim 0) that is already the result's layout, so no second copy.
  Tensor raw = Tensor::empty(p.outer == 1 ? shape : Shape{g * x.numel()});
  dist::Communicator* comm = group.comm;
  auto work = comm->start_all_gather(local.data<float>(), x.numel(), raw.data<float>(), group.ranks);
  return StartedCollective([comm, work, local, raw, shape, p, g, row] {
    comm->wait(work);
    if (p.outer == 1) return raw;
    Tensor out = Tensor::empty(shape);  // [outer, g, row]
    float* dst = out.data<float>();
    const float* src = raw.data<float>();
    for (int64_t r = 0; r < g; ++r) {
      for (int64_t o = 0; o < p.outer; ++o) {
        std::memcpy(dst + (o * g + r) * row, src + (r * p.outer + o) * row, static_cast<size_t>(row) * sizeof(float));
      }
    }
    return out;
  });
}

StartedCollective start_reduce_scatter_values(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "reduce_scatter");
  const int64_t g = group.size();
  if (g == 1) {
    Tensor copy = x.detach().clone();
    return StartedCollective([copy] { return copy; });
  }
  const Split p = split_at(x.shape(), dim);
  LOOM_CHECK(p.length % g == 0, "reduce_scatter: dimension ", dim, " of ", x.describe(), " does not divide by the group's ",
             g, " members");
  const int64_t n = p.length / g, row = n * p.inner, block = p.outer * row;
  Tensor packed = x.detach();  // [g, outer, row]: x itself when outer is 1
  if (p.outer != 1) {
    packed = Tensor::empty({x.numel()});
    const float* src = x.data<float>();
    float* dst = packed.data<float>();
    for (int64_t r = 0; r < g; ++r) {
      for (int64_t o = 0; o < p.outer; ++o) {
        std::memcpy(dst + r * block + o * row, src + (o * g + r) * row, static_cast<size_t>(row) * sizeof(float));
      }
    }
  }
  Tensor out = Tensor::empty(with_dim(x.shape(), dim, n));
  dist::Communicator* comm = group.comm;
  auto work = comm->start_reduce_scatter_sum(packed.data<float>(), block, out.data<float>(), group.ranks);
  return StartedCollective([comm, work, packed, out] {
    comm->wait(work);
    return out;
  });
}

namespace {
Tensor all_reduce_values(const Tensor& x, const dist::Group& group) {
  Tensor out = x.detach().clone();
  if (group.size() > 1) group.comm->all_reduce_sum(out.data<float>(), out.numel(), group.ranks);
  return out;
}
}  // namespace

Tensor all_gather(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "all_gather");
  Tensor out = all_gather_values(x, dim, group);
  if (group.size() == 1) out = x.detach().clone();
  autograd::record("all_gather", {x}, {out}, [dim, group](const autograd::BackwardContext& ctx) {
    return TensorList{reduce_scatter_values(ctx.grad_output(0), dim, group)};
  });
  return out;
}

Tensor reduce_scatter(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "reduce_scatter");
  Tensor out = reduce_scatter_values(x, dim, group);
  autograd::record("reduce_scatter", {x}, {out}, [dim, group](const autograd::BackwardContext& ctx) {
    return TensorList{group.size() == 1 ? ctx.grad_output(0) : all_gather_values(ctx.grad_output(0), dim, group)};
  });
  return out;
}

Tensor all_reduce(const Tensor& x, const dist::Group& group) {
  checked_dim(x, 0, "all_reduce");
  Tensor out = all_reduce_values(x, group);
  autograd::record("all_reduce", {x}, {out}, [](const autograd::BackwardContext& ctx) {
    return TensorList{ctx.grad_output(0)};
  });
  return out;
}

Tensor copy_to_group(const Tensor& x, const dist::Group& group) {
  checked_dim(x, 0, "copy_to_group");
  Tensor out = x.detach().clone();
  autograd::record("copy_to_group", {x}, {out}, [group](const autograd::BackwardContext& ctx) {
    return TensorList{all_reduce_values(ctx.grad_output(0), group)};
  });
  return out;
}

Tensor gather_replicated(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "gather_replicated");
  Tensor out = group.size() == 1 ? x.detach().clone() : all_gather_values(x, dim, group);
  const int64_t index = group.size() == 1 ? 0 : group.index(), blocks = group.size();
  autograd::record("gather_replicated", {x}, {out}, [dim, index, blocks](const autograd::BackwardContext& ctx) {
    return TensorList{block_of(ctx.grad_output(0), dim, index, blocks)};
  });
  return out;
}

Tensor split_replicated(const Tensor& x, int dim, const dist::Group& group) {
  dim = checked_dim(x, dim, "split_replicated");
  const int64_t index = group.size() == 1 ? 0 : group.index(), blocks = group.size();
  Tensor out = block_of(x, dim, index, blocks);
  autograd::record("split_replicated", {x}, {out}, [dim, group](const autograd::BackwardContext& ctx) {
    return TensorList{group.size() == 1 ? ctx.grad_output(0) : all_gather_values(ctx.grad_output(0), dim, group)};
  });
  return out;
}

std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, const dist::Group& group) {
  LOOM_CHECK(static_cast<int>(send.size()) == group.size(), "exchange_counts: ", send.size(), " counts for a group of ",
             group.size());
  if (group.size() == 1) return send;
  std::vector<int64_t> recv(send.size());
  group.comm->all_to_all_counts(send.data(), recv.data(), group.ranks);
  return recv;
}

namespace {
Tensor all_to_all_values(const Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                         const dist::Group& group) {
  int64_t C = 1;  // floats per row
  for (int d = 1; d < x.ndim(); ++d) C *= x.size(d);
  int64_t sent = 0, received = 0;
  std::vector<int64_t> send(send_rows.size()), recv(recv_rows.size());
  for (size_t i = 0; i < send_rows.size(); ++i) {
    send[i] = send_rows[i] * C;
    recv[i] = recv_rows[i] * C;
    sent += send_rows[i];
    received += recv_rows[i];
  }
  LOOM_CHECK(sent == x.size(0), "all_to_all: send counts add up to ", sent, " rows, x has ", x.size(0));
  Shape shape = x.shape();
  shape[0] = received;
  Tensor out = Tensor::empty(shape);
  Tensor in = x.detach();
  if (group.size() == 1) {
    if (out.numel() > 0) std::memcpy(out.data<float>(), in.data<float>(), static_cast<size_t>(out.numel()) * sizeof(float));
    return out;
  }
  group.comm->all_to_all_v(in.data<float>(), send.data(), out.data<float>(), recv.data(), group.ranks);
  return out;
}
}  // namespace

Tensor all_to_all(const Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                  const dist::Group& group) {
  checked_dim(x, 0, "all_to_all");
  LOOM_CHECK(static_cast<int>(send_rows.size()) == group.size() && static_cast<int>(recv_rows.size()) == group.size(),
             "all_to_all: ", send_rows.size(), " send and ", recv_rows.size(), " receive counts for a group of ",
             group.size());
  Tensor out = all_to_all_values(x, send_rows, recv_rows, group);
  autograd::record("all_to_all", {x}, {out}, [send_rows, recv_rows, group](const autograd::BackwardContext& ctx) {
    // The rows go back where they came from: what this member received, it returns.
    return TensorList{all_to_all_values(ctx.grad_output(0), recv_rows, send_rows, group)};
  });
  return out;
}

}  // namespace loom::ops
