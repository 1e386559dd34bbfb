// The NCCL communicator (nccl_communicator.h). Compiled and linked in every CUDA build with NCCL;
// untested until a run on GPUs (docs/cuda.md).
#include "mesh/nccl/nccl_communicator.h"

#include <nccl.h>

#include <algorithm>
#include <map>
#include <thread>

#include "backends/cuda/check.h"
#include "backends/cuda/runtime.h"

namespace loom::dist {
namespace {

std::string group_text(const std::vector<int>& g) {
  std::string s = "{";
  for (size_t i = 0; i < g.size(); ++i) s += (i ? "," : "") + std::to_string(g[i]);
  return s + "}";
}

class NcclCommunicator final : public dist::Communicator {
 public:
  NcclCommunicator(std::shared_ptr<dist::Communicator> bootstrap, int device, std::chrono::milliseconds timeout)
      : bootstrap_(std::move(bootstrap)), device_(device), timeout_(timeout) {
    LOOM_CHECK(bootstrap_ != nullptr, "nccl communicator: no bootstrap communicator");
    cuda::check_device("nccl communicator", Device::cuda(device));
  }
  ~NcclCommunicator() override {
    for (auto& [ranks, comm] : comms_) {
      if (comm != nullptr) (void)(aborted_ ? ncclCommAbort(comm) : ncclCommDestroy(comm));
    }
  }

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  std::string kind() const override { return "nccl"; }

  void all_reduce_sum(float* data, int64_t n, const std::vector<int>& group) override {
    if (group.size() > 1) {
      run("all_reduce_sum", group, [&](ncclComm_t c, cudaStream_t s) {
        return ncclAllReduce(data, data, count(n), ncclFloat32, ncclSum, c, s);
      });
    }
    stats.all_reduce_bytes += n * 4;
    ++stats.calls;
  }
  void all_reduce_sum(double* data, int64_t n, const std::vector<int>& group) override {
    if (group.size() > 1) {
      run("all_reduce_sum", group, [&](ncclComm_t c, cudaStream_t s) {
        return ncclAllReduce(data, data, count(n), ncclFloat64, ncclSum, c, s);
      });
    }
    stats.all_reduce_bytes += n * 8;
    ++stats.calls;
  }
  void all_gather(const float* in, int64_t n, float* out, const std::vector<int>& group) override {
    if (group.size() > 1) {
      run("all_gather", group, [&](ncclComm_t c, cudaStream_t s) {
        return ncclAllGather(in, out, count(n), ncclFloat32, c, s);
      });
    } else {
      cuda::copy(out, Device::cuda(device_), in, Device::cuda(device_), static_cast<size_t>(n) * 4, "all_gather");
    }
    stats.all_gather_bytes += n * 4;
    ++stats.calls;
  }
  void reduce_scatter_sum(const float* in, int64_t n, float* out, const std::vector<int>& group) override {
    if (group.size() > 1) {
      run("reduce_scatter_sum", group, [&](ncclComm_t c, cudaStream_t s) {
        return ncclReduceScatter(in, out, count(n), ncclFloat32, ncclSum, c, s);
      });
    } else {
      cuda::copy(out, Device::cuda(device_), in, Device::cuda(device_), static_cast<size_t>(n) * 4, "reduce_scatter_sum");
    }
    stats.reduce_scatter_bytes += n * 4 * static_cast<int64_t>(group.size());
    ++stats.calls;
  }
  void broadcast(float* data, int64_t n, int root, const std::vector<int>& group) override {
    const auto it = std::find(group.begin(), group.end(), root);
    LOOM_CHECK(it != group.end(), "broadcast: root ", root, " is not in the group ", group_text(group));
    const int root_index = static_cast<int>(it - group.begin());
    if (group.size() > 1) {
      run("broadcast", group, [&](ncclComm_t c, cudaStream_t s) {
        return ncclBroadcast(data, data, count(n), ncclFloat32, root_index, c, s);
      });
    }
    stats.broadcast_bytes += n * 4;
    ++stats.calls;
  }
  void barrier(const std::vector<int>& group) override {
    // The device's queued work first, then the hosts meet.
    cuda::synchronize(Device::cuda(device_), "barrier");
    bootstrap_->barrier(group);
  }

  // The counts live on the host (they size the receiving buffers), so they travel over the bootstrap.
  void all_to_all_counts(const int64_t* send, int64_t* recv, const std::vector<int>& group) override {
    bootstrap_->all_to_all_counts(send, recv, group);
    ++stats.calls;
  }
  // Device buffers: one grouped send and receive per member (NCCL has no all-to-all-v of its own).
  void all_to_all_v(const float* in, const int64_t* send_counts, float* out, const int64_t* recv_counts,
                    const std::vector<int>& group) override {
    const int me = index_in(group);
    run("all_to_all_v", group, [&](ncclComm_t c, cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      int64_t s_at = 0, r_at = 0;
      for (size_t i = 0; i < group.size() && r == ncclSuccess; ++i) {
        const int peer = static_cast<int>(i);
        if (send_counts[i] > 0) r = ncclSend(in + s_at, count(send_counts[i]), ncclFloat32, peer, c, s);
        if (r == ncclSuccess && recv_counts[i] > 0) r = ncclRecv(out + r_at, count(recv_counts[i]), ncclFloat32, peer, c, s);
        s_at += send_counts[i];
        r_at += recv_counts[i];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    for (size_t i = 0; i < group.size(); ++i) {
      if (static_cast<int>(i) != me) stats.all_to_all_bytes += send_counts[i] * 4;
    }
    ++stats.calls;
  }

 private:
  static size_t count(int64_t n) {
    LOOM_CHECK(n >= 0, "nccl: negative element count ", n);
    return static_cast<size_t>(n);
  }

  using Deadline = std::chrono::steady_clock::time_point;

  // Waits until `comm` has no operation in progress and, when `stream` is given, the stream is idle;
  // gives up at the deadline by aborting the communicator (NCCL's way to unblock a collective a peer
  // never joins).
  void wait(ncclComm_t comm, cudaStream_t stream, const char* op, const std::vector<int>& group, Deadline deadline) {
    for (;;) {
      ncclResult_t async = ncclSuccess;
      (void)ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        fail(op, group, str("NCCL error ", ncclGetErrorString(async), " (", ncclGetLastError(comm), ")"));
      }
      bool stream_done = true;
      if (stream != nullptr) {
        const cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaErrorNotReady) {
          (void)cudaGetLastError();
          stream_done = false;
        } else {
          LOOM_CUDA_CHECK(op, e);
        }
      }
      if (async == ncclSuccess && stream_done) return;
      if (std::chrono::steady_clock::now() > deadline) {
        fail(op, group, str("timed out after ", timeout_.count(), " ms waiting for the other ranks"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  [[noreturn]] void fail(const char* op, const std::vector<int>& group, const std::string& why) {
    aborted_ = true;
    for (auto& [ranks, comm] : comms_) {
      if (comm != nullptr) (void)ncclCommAbort(comm);
      comm = nullptr;
    }
    throw Error(str("rank ", rank(), ": nccl ", op, " on group ", group_text(group), ": ", why));
  }

  // The group's NCCL communicator, made on first use by its members: the first member draws the id,
  // the bootstrap (MPI) broadcasts it within the group, and every member joins without blocking.
  ncclComm_t comm_for(const std::vector<int>& group, const char* op) {
    LOOM_CHECK(!aborted_, "rank ", rank(), ": nccl ", op, ": the communicator was aborted by an earlier failure");
    auto it = comms_.find(group);
    if (it != comms_.end()) return it->second;
    ncclUniqueId id{};
    static_assert(sizeof(ncclUniqueId) % sizeof(float) == 0);
    const int index = index_in(group);
    if (index == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      LOOM_CHECK(r == ncclSuccess, "nccl ", op, ": ncclGetUniqueId: ", ncclGetErrorString(r));
    }
    bootstrap_->broadcast(reinterpret_cast<float*>(&id), sizeof(id) / sizeof(float), group[0], group);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    cuda::DeviceGuard guard(device_, op);
    const ncclResult_t r = ncclCommInitRankConfig(&comm, static_cast<int>(group.size()), id, index, &config);
    LOOM_CHECK(r == ncclSuccess || r == ncclInProgress, "nccl ", op, ": joining group ", group_text(group), ": ",
               ncclGetErrorString(r));
    comms_[group] = comm;
    wait(comm, nullptr, op, group, std::chrono::steady_clock::now() + timeout_);
    return comm;
  }

  template <typename F>
  void run(const char* op, const std::vector<int>& group, F&& call) {
    ncclComm_t comm = comm_for(group, op);
    cuda::Context& ctx = cuda::context(device_);
    cuda::DeviceGuard guard(device_, op);
    const ncclResult_t r = call(comm, ctx.stream);
    if (r != ncclSuccess && r != ncclInProgress) fail(op, group, str("NCCL error ", ncclGetErrorString(r)));
    wait(comm, ctx.stream, op, group, std::chrono::steady_clock::now() + timeout_);
  }

  std::shared_ptr<dist::Communicator> bootstrap_;
  int device_;
  std::chrono::milliseconds timeout_;
  std::map<std::vector<int>, ncclComm_t> comms_;
  bool aborted_ = false;
};

}  // namespace

bool nccl_built() { return true; }

std::unique_ptr<dist::Communicator> make_nccl_communicator(std::shared_ptr<dist::Communicator> bootstrap, int device,
                                                           std::chrono::milliseconds timeout) {
  return std::make_unique<NcclCommunicator>(std::move(bootstrap), device, timeout);
}

}  // namespace loom::dist
