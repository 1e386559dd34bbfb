// Collective communication between the ranks of a run, behind one interface with two implementations:
//   * InProcessWorld (here): N ranks as N threads of one process, for tests and for Python, the way
//     JAX's --xla_force_host_platform_device_count=8 simulates devices on one CPU.
//   * MPI (mesh/mpi.h, built when CMake finds MPI): processes on one or many machines.
// The model and the trainer only see Communicator, so the same code runs on both.
//
// Conventions:
//   * A collective runs on a group: the world ranks of one mesh axis (Mesh::group), listed in axis
//     order, which every member passes identically. Members call the same collectives in the same order.
//   * Blocks are ordered by position in the group: all_gather's output holds member 0's block first.
//   * Sums add the members' values in group order, so every member gets bitwise the same result and a
//     run is reproducible whatever the thread timing.
//   * Nothing waits forever: a collective that a peer never joins (a crashed rank) throws a loom::Error
//     naming the collective after the communicator's timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace loom::dist {

// Bytes this rank handed to the transport, per kind of collective (what the benchmarks report). The
// payload is counted once per call: an all-reduce of n floats counts 4n bytes, whatever algorithm the
// transport uses underneath.
struct CommStats {
  int64_t all_reduce_bytes = 0, all_gather_bytes = 0, reduce_scatter_bytes = 0, broadcast_bytes = 0;
  int64_t all_to_all_bytes = 0;  // what this rank sends to the others (its block for itself excluded)
  int64_t send_bytes = 0;        // point to point (the pipeline's activations and their gradients), sent
  int64_t sends = 0;             // point-to-point messages sent
  int64_t calls = 0;
  double wait_seconds = 0;  // the caller's thread blocked in collectives (blocking calls and waits on started ones)
  double wait_cpu_seconds = 0;  // the CPU time that thread took while blocked (polling, naps' wake-ups, copies)
  int64_t started = 0;      // collectives started in the background (start_*)
  int64_t total_bytes() const {
    return all_reduce_bytes + all_gather_bytes + reduce_scatter_bytes + broadcast_bytes + all_to_all_bytes + send_bytes;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // in the world
  virtual int size() const = 0;  // of the world
  virtual std::string kind() const = 0;  // "in-process", "mpi"

  // data[0..n) <- sum over the group's members of their data[0..n).
  virtual void all_reduce_sum(float* data, int64_t n, const std::vector<int>& group) = 0;
  virtual void all_reduce_sum(double* data, int64_t n, const std::vector<int>& group) = 0;
  // out[i*n .. (i+1)*n) <- member i's in[0..n).
  virtual void all_gather(const float* in, int64_t n, float* out, const std::vector<int>& group) = 0;
  // out[0..n) <- sum over members of their in[k*n .. (k+1)*n), where k is this rank's place in the group.
  virtual void reduce_scatter_sum(const float* in, int64_t n, float* out, const std::vector<int>& group) = 0;
  // data[0..n) <- world rank `root`'s data[0..n) (root must be in the group).
  virtual void broadcast(float* data, int64_t n, int root, const std::vector<int>& group) = 0;
  virtual void barrier(const std::vector<int>& group) = 0;

  // All-to-all with per-member sizes (expert parallelism's token dispatch; MPI_Alltoall + MPI_Alltoallv).
  // Counts first: recv[i] <- member i's send[k], where k is this rank's place in the group (g each).
  virtual void all_to_all_counts(const int64_t* send, int64_t* recv, const std::vector<int>& group) = 0;
  // `in` holds g blocks back to back, block i (send_counts[i] floats) for member i; `out` receives g
  // blocks back to back, block i (recv_counts[i] floats, from all_to_all_counts) from member i.
  virtual void all_to_all_v(const float* in, const int64_t* send_counts, float* out, const int64_t* recv_counts,
                            const std::vector<int>& group) = 0;

  // Point to point (the pipe axis, parallel/pipeline.h). send() copies data[0..n) into the transport and
  // returns without waiting for the receiver (MPI_Isend of a copy), so a schedule in which every receive
  // is eventually matched cannot deadlock on sends; recv() blocks until the message from `src` arrives.
  // Messages from one rank to another arrive in send order; the sizes must agree (checked). Like the
  // collectives, both first wait for the started collectives, and a peer that never sends ends the wait
  // with an error after the timeout. complete_sends() waits until every sent message has been taken
  // (the step's end: the copies are freed). Communicators without them throw.
  virtual void send(const float* data, int64_t n, int dst);
  virtual void recv(float* data, int64_t n, int src);
  virtual void complete_sends() {}

  // All world ranks, in order.
  std::vector<int> world() const;
  // This rank's place in `group`; throws if absent (a bug in the caller).
  int index_in(const std::vector<int>& group) const;

  CommStats stats;

  // ---- Started collectives, for overlapping communication with compute (docs/mesh.md) ----
  // start_* hands the collective to this rank's communication thread (made on first use) and returns at
  // once; wait() blocks until it is done and rethrows its error. Buffers must stay alive and untouched
  // until then. Started collectives run one at a time in start order, through the blocking calls above,
  // and every blocking collective first waits for all started ones: each rank still issues the same
  // collectives in the same order, and the results are bitwise those of the blocking calls.
  struct Work;
  using Pending = std::shared_ptr<Work>;
  Pending start_all_gather(const float* in, int64_t n, float* out, const std::vector<int>& group);
  Pending start_reduce_scatter_sum(const float* in, int64_t n, float* out, const std::vector<int>& group);
  Pending start_all_reduce_sum(float* data, int64_t n, const std::vector<int>& group);
  void wait(const Pending& work);  // a null handle is done
  void wait_all();                 // every started collective

 protected:
  // Opens every blocking collective of an implementation: waits for the started ones (unless it runs on
  // the communication thread) and adds the time the caller spends to stats.wait_seconds.
  class Blocking {
   public:
    explicit Blocking(Communicator& c);
    ~Blocking();
    Blocking(const Blocking&) = delete;
    Blocking& operator=(const Blocking&) = delete;

   private:
    Communicator* c_;
    std::chrono::steady_clock::time_point start_;
    double cpu_start_ = 0;
  };
  // Waits for the started collectives unless called on the communication thread. Blocking does it; the
  // implementations' per-call helpers do it too, so a collective added without a Blocking stays ordered.
  void settle();
  void stop_communication_thread();  // implementations' destructors: started work then runs no more
  // For a transport's polling loop. On the communication thread, whether the compute thread is blocked
  // waiting for started work (then its core is idle and polling costs nobody); a nap there ends as soon
  // as the compute thread blocks. Anywhere else: false, and a plain sleep.
  bool on_communication_thread() const;
  bool compute_thread_blocked() const;
  void nap(std::chrono::microseconds d);
  bool run_started_inline_ = false;  // a transport that cannot take calls from a second thread

 private:
  struct Async;
  Pending start(std::function<void()> collective);
  std::shared_ptr<Async> async_;
};

// A communicator and one of its groups: what a collective op needs. size 1 makes every collective the
// identity (a mesh axis of size 1).
struct Group {
  Communicator* comm = nullptr;
  std::vector<int> ranks;
  int size() const { return static_cast<int>(ranks.size()); }
  int index() const { return comm->index_in(ranks); }
};

// Shared state of N in-process ranks. Make one, then hand communicator(r) to the thread of rank r (or use
// run_in_process). If a rank fails, the others' pending and later collectives throw instead of waiting.
class InProcessWorld {
 public:
  explicit InProcessWorld(int size, std::chrono::milliseconds timeout = std::chrono::minutes(5));
  ~InProcessWorld();
  InProcessWorld(const InProcessWorld&) = delete;
  InProcessWorld& operator=(const InProcessWorld&) = delete;

  int size() const;
  Communicator& communicator(int rank);
  // Marks the world failed: every waiting or later collective throws naming `rank` and `why`.
  void abort(int rank, const std::string& why);

  struct State;

 private:
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

// Runs fn(rank, communicator) on `size` threads and waits for all. When ranks throw, the others are
// released (their collectives throw) and the first failure is rethrown here, naming its rank.
void run_in_process(int size, const std::function<void(int rank, Communicator& comm)>& fn);

}  // namespace loom::dist
