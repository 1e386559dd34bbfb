// Collectives as differentiable ops: each forward's gradient is its conjugate collective, so a model
// that runs on local shards gets the gradients of the global model from plain backward().
//
//   op                       forward                              backward
//   all_gather               concat the members' x along dim      reduce_scatter (sum) along dim
//   reduce_scatter           sum, keep this member's block        all_gather along dim
//   all_reduce               sum over members (Megatron g)        identity
//   copy_to_group            identity (Megatron f)                all_reduce
//   gather_replicated        concat the members' x along dim      keep this member's block
//   split_replicated         keep this member's block along dim   all_gather along dim
//   all_to_all               rows to member i: send_rows[i]       all_to_all with the counts swapped
//
// all_gather <-> reduce_scatter are for values each member uses on different data (FSDP's weights:
// every data rank's loss adds to the weight's gradient). The *_replicated pair is for values the group
// computes redundantly (the tensor axis's activations and the weights it gathers): every member already
// holds the whole gradient, so summing it again would count it group-size times.
//
// Legend: x is any contiguous f32 tensor; g the group size; dim splits into g equal blocks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "mesh/communicator.h"

namespace loom::ops {

Tensor all_gather(const Tensor& x, int dim, const dist::Group& group);          // [.., n, ..] -> [.., g*n, ..]
Tensor reduce_scatter(const Tensor& x, int dim, const dist::Group& group);      // [.., g*n, ..] -> [.., n, ..]
Tensor all_reduce(const Tensor& x, const dist::Group& group);
Tensor copy_to_group(const Tensor& x, const dist::Group& group);
Tensor gather_replicated(const Tensor& x, int dim, const dist::Group& group);   // [.., n, ..] -> [.., g*n, ..]
Tensor split_replicated(const Tensor& x, int dim, const dist::Group& group);    // [.., g*n, ..] -> [.., n, ..]

// x: [sum(send_rows), C], rows for member 0 first -> [sum(recv_rows), C], rows from member 0 first.
// recv_rows comes from exchange_counts. Expert parallelism's dispatch and return.
Tensor all_to_all(const Tensor& x, const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows,
                  const dist::Group& group);
// recv[i] <- member i's send[this member's place]: how many rows each member will send here.
std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, const dist::Group& group);

// Not recorded (no autodiff): the raw data movements the ops above are made of.
Tensor all_gather_values(const Tensor& x, int dim, const dist::Group& group);
Tensor reduce_scatter_values(const Tensor& x, int dim, const dist::Group& group);
Tensor block_of(const Tensor& x, int dim, int64_t index, int64_t blocks);  // block `index` of `blocks` along dim

// all_gather_values and reduce_scatter_values in two halves, to overlap the collective with compute:
// start_* hands it to the communicator's thread (dist::Communicator::start_*) and returns; wait() gives
// the same result as the one-call version. x (and its memory) must not change until then; the staging
// buffers are freed when wait() returns.
class StartedCollective {
 public:
  StartedCollective() = default;
  explicit StartedCollective(std::function<Tensor()> finish) : finish_(std::move(finish)) {}
  StartedCollective(StartedCollective&&) = default;
  StartedCollective& operator=(StartedCollective&& other);
  StartedCollective(const StartedCollective&) = delete;
  StartedCollective& operator=(const StartedCollective&) = delete;
  ~StartedCollective();  // waits if nobody did: the communication thread may still write the buffers

  bool defined() const { return static_cast<bool>(finish_); }
  Tensor wait();  // once

 private:
  std::function<Tensor()> finish_;
};
StartedCollective start_all_gather_values(const Tensor& x, int dim, const dist::Group& group);
StartedCollective start_reduce_scatter_values(const Tensor& x, int dim, const dist::Group& group);

}  // namespace loom::ops
