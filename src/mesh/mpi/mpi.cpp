// The MPI communicator. Groups (mesh axes) get their own MPI communicators, made with
// MPI_Comm_create_group, which only the group's members call, so a group can be first used lazily.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <thread>

#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "core/error.h"
#include "mesh/mpi.h"

namespace loom::dist {
namespace {

void check(int code, const char* what, const char* file, int line) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  throw Error(str(what, " failed at ", file, ":", line, ": ", std::string(text, static_cast<size_t>(len))));
}
#define LOOM_MPI(call) check((call), #call, __FILE__, __LINE__)

std::string group_text(const std::vector<int>& g) {
  std::string s = "{";
  for (size_t i = 0; i < g.size(); ++i) s += (i ? "," : "") + std::to_string(g[i]);
  return s + "}";
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::chrono::milliseconds timeout) : timeout_(timeout) {
    LOOM_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    LOOM_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    // Started collectives run on a second thread (never at the same time as this one's calls).
    int level = MPI_THREAD_SINGLE;
    LOOM_MPI(MPI_Query_thread(&level));
    run_started_inline_ = level < MPI_THREAD_SERIALIZED;
    core_per_rank_ = core_per_rank();
  }
  ~MpiCommunicator() override {
    stop_communication_thread();
    try {
      complete_sends();
    } catch (...) {  // a peer gone: the job is ending anyway
    }
    for (auto& [ranks, comm] : comms_) {
      if (comm != MPI_COMM_WORLD) MPI_Comm_free(&comm);
    }
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "mpi"; }

  void all_reduce_sum(float* data, int64_t n, const std::vector<int>& group) override {
    Blocking guard(*this);
    if (group.size() > 1) reduce(data, n, MPI_FLOAT, group);
    stats.all_reduce_bytes += n * 4;
    ++stats.calls;
  }
  void all_reduce_sum(double* data, int64_t n, const std::vector<int>& group) override {
    Blocking guard(*this);
    if (group.size() > 1) reduce(data, n, MPI_DOUBLE, group);
    stats.all_reduce_bytes += n * 8;
    ++stats.calls;
  }

  void all_gather(const float* in, int64_t n, float* out, const std::vector<int>& group) override {
    Blocking guard(*this);
    MPI_Request req;
    LOOM_MPI(MPI_Iallgather(in, count(n), MPI_FLOAT, out, count(n), MPI_FLOAT, comm(group), &req));
    wait(req, "all_gather", group);
    stats.all_gather_bytes += n * 4;
    ++stats.calls;
  }

  void reduce_scatter_sum(const float* in, int64_t n, float* out, const std::vector<int>& group) override {
    Blocking guard(*this);
    // As a sum of the members' blocks in group order: an all-to-all, then a local sum, so every
    // member's block is added in the same order as in the in-process communicator.
    const int g = static_cast<int>(group.size());
    float* blocks = scratch<float>(1, n * g);
    MPI_Request req;
    LOOM_MPI(MPI_Ialltoall(in, count(n), MPI_FLOAT, blocks, count(n), MPI_FLOAT, comm(group), &req));
    wait(req, "reduce_scatter", group);
    std::fill(out, out + n, 0.0f);
    for (int i = 0; i < g; ++i) {
      const float* b = blocks + static_cast<int64_t>(i) * n;
      for (int64_t j = 0; j < n; ++j) out[j] += b[j];
    }
    stats.reduce_scatter_bytes += n * g * 4;
    ++stats.calls;
  }

  void broadcast(float* data, int64_t n, int root, const std::vector<int>& group) override {
    Blocking guard(*this);
    auto it = std::find(group.begin(), group.end(), root);
    LOOM_ASSERT(it != group.end(), "broadcast root ", root, " is not in the group");
    MPI_Request req;
    LOOM_MPI(MPI_Ibcast(data, count(n), MPI_FLOAT, static_cast<int>(it - group.begin()), comm(group), &req));
    wait(req, "broadcast", group);
    if (rank_ == root) stats.broadcast_bytes += n * 4;
    ++stats.calls;
  }

  void barrier(const std::vector<int>& group) override {
    Blocking guard(*this);
    MPI_Request req;
    LOOM_MPI(MPI_Ibarrier(comm(group), &req));
    wait(req, "barrier", group);
    ++stats.calls;
  }

  void all_to_all_counts(const int64_t* send, int64_t* recv, const std::vector<int>& group) override {
    Blocking guard(*this);
    MPI_Request req;
    LOOM_MPI(MPI_Ialltoall(send, 1, MPI_INT64_T, recv, 1, MPI_INT64_T, comm(group), &req));
    wait(req, "all_to_all_counts", group);
    ++stats.calls;
  }

  void all_to_all_v(const float* in, const int64_t* send_counts, float* out, const int64_t* recv_counts,
                    const std::vector<int>& group) override {
    Blocking guard(*this);
    const size_t g = group.size();
    std::vector<int> sc(g), sd(g), rc(g), rd(g);
    int64_t s_at = 0, r_at = 0;
    const int me = index_in(group);
    for (size_t i = 0; i < g; ++i) {
      sc[i] = count(send_counts[i]);
      rc[i] = count(recv_counts[i]);
      sd[i] = count(s_at);
      rd[i] = count(r_at);
      s_at += send_counts[i];
      r_at += recv_counts[i];
      if (static_cast<int>(i) != me) stats.all_to_all_bytes += send_counts[i] * 4;
    }
    MPI_Request req;
    LOOM_MPI(MPI_Ialltoallv(in, sc.data(), sd.data(), MPI_FLOAT, out, rc.data(), rd.data(), MPI_FLOAT, comm(group), &req));
    wait(req, "all_to_all_v", group);
    ++stats.calls;
  }

  // On MPI_COMM_WORLD with its own tag: point-to-point and collectives never match each other, and MPI
  // keeps messages between two ranks on one communicator and tag in order.
  void send(const float* data, int64_t n, int dst) override {
    Blocking guard(*this);
    settle();
    test_sends();
    Outgoing out{std::vector<float>(data, data + n), MPI_REQUEST_NULL, dst};
    sends_.push_back(std::move(out));
    Outgoing& o = sends_.back();
    LOOM_MPI(MPI_Isend(o.data.data(), count(n), MPI_FLOAT, dst, kP2pTag, MPI_COMM_WORLD, &o.req));
    stats.send_bytes += n * 4;
    ++stats.sends;
    ++stats.calls;
  }

  void recv(float* data, int64_t n, int src) override {
    Blocking guard(*this);
    settle();
    MPI_Request req;
    LOOM_MPI(MPI_Irecv(data, count(n), MPI_FLOAT, src, kP2pTag, MPI_COMM_WORLD, &req));
    MPI_Status status;
    wait(req, "recv", {src, rank_}, &status);
    int got = 0;
    LOOM_MPI(MPI_Get_count(&status, MPI_FLOAT, &got));
    LOOM_CHECK(got == n, "recv: rank ", rank_, " expected ", n, " floats from rank ", src, ", the message holds ", got);
    test_sends();
    ++stats.calls;
  }

  void complete_sends() override {
    settle();
    for (Outgoing& o : sends_) wait(o.req, "send", {rank_, o.dst});
    sends_.clear();
  }

 private:
  // A reduce-scatter then an all-gather (2n(g-1)/g elements on the wire, like a ring, and O(n) memory),
  // each element summed over the members in group order by the member that owns its chunk: every member
  // gets the same bits, in the in-process communicator's order. (MPI_Allreduce does not promise equal
  // results on all ranks, and replicated weights must stay bitwise identical.)
  // In place where the group divides n (no copies but MPI's): the all-to-all reads `data` and the
  // sums are written into this member's chunk of it, which the all-gather (MPI_IN_PLACE) sends. Else
  // through a scratch copy padded with zeros. The scratch lives on (collectives never run on two threads
  // at once): a fresh 256 KiB vector per call cost its zero-filling and page faults.
  template <typename T>
  void reduce(T* data, int64_t n, MPI_Datatype type, const std::vector<int>& group) {
    const int g = static_cast<int>(group.size());
    const int me = index_in(group);
    const int64_t chunk = (n + g - 1) / g;
    T* whole = data;  // chunk * g elements
    if (chunk * g != n) {
      whole = scratch<T>(0, chunk * g);
      std::copy(data, data + n, whole);
      std::fill(whole + n, whole + chunk * g, T(0));
    }
    T* blocks = scratch<T>(1, chunk * g);
    MPI_Request req;
    LOOM_MPI(MPI_Ialltoall(whole, count(chunk), type, blocks, count(chunk), type, comm(group), &req));
    wait(req, "all_reduce", group);
    T* mine = whole + static_cast<int64_t>(me) * chunk;  // (its input was sent: free to overwrite)
    std::fill(mine, mine + chunk, T(0));
    for (int i = 0; i < g; ++i) {  // block by block: contiguous, vectorised
      const T* b = blocks + static_cast<int64_t>(i) * chunk;
      for (int64_t j = 0; j < chunk; ++j) mine[j] += b[j];
    }
    LOOM_MPI(MPI_Iallgather(MPI_IN_PLACE, 0, type, whole, count(chunk), type, comm(group), &req));
    wait(req, "all_reduce", group);
    if (whole != data) std::copy(whole, whole + n, data);
  }
  // Scratch buffer `which` of at least `elements` Ts, grown (never shrunk) on demand.
  template <typename T>
  T* scratch(int which, int64_t elements) {
    std::vector<unsigned char>& s = scratch_[which];
    const size_t bytes = static_cast<size_t>(elements) * sizeof(T);
    if (s.size() < bytes) s.resize(bytes);
    return reinterpret_cast<T*>(s.data());
  }
  std::vector<unsigned char> scratch_[2];

  static constexpr int kP2pTag = 7;
  struct Outgoing {
    std::vector<float> data;  // the copy MPI reads until the request completes
    MPI_Request req;
    int dst;
  };
  std::deque<Outgoing> sends_;  // deque: an element's address stays put while others are added
  // Frees the sends that completed (keeps MPI progressing them meanwhile).
  void test_sends() {
    while (!sends_.empty()) {
      int done = 0;
      LOOM_MPI(MPI_Test(&sends_.front().req, &done, MPI_STATUS_IGNORE));
      if (!done) return;
      sends_.pop_front();
    }
  }

  static int count(int64_t n) {
    LOOM_CHECK(n >= 0 && n <= INT32_MAX, "MPI: a collective of ", n, " elements exceeds MPI's int count");
    return static_cast<int>(n);
  }

  MPI_Comm comm(const std::vector<int>& group) {
    settle();  // (Blocking did already, in the collectives above)
    auto it = comms_.find(group);
    if (it != comms_.end()) return it->second;
    LOOM_ASSERT(std::find(group.begin(), group.end(), rank_) != group.end(), "rank ", rank_, " is not in group ",
                group_text(group));
    MPI_Comm c = MPI_COMM_WORLD;
    if (static_cast<int>(group.size()) != size_) {
      MPI_Group world, sub;
      LOOM_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world));
      LOOM_MPI(MPI_Group_incl(world, static_cast<int>(group.size()), group.data(), &sub));
      LOOM_MPI(MPI_Comm_create_group(MPI_COMM_WORLD, sub, /*tag=*/0, &c));
      MPI_Group_free(&sub);
      MPI_Group_free(&world);
    }
    comms_[group] = c;
    return c;
  }

  // Polls until the request completes; gives up after the timeout (a dead peer never completes it).
  // Open MPI progresses a transfer only inside MPI calls, on both ends, so a rank that naps holds up its
  // peers until its nap ends. Where the node has a core for each of its ranks, nobody else wants the
  // caller's core: it polls without sleeping for up to kSpin (a 256 KiB all-reduce between 2 ranks takes
  // ~120 us), then naps 1 us, 2, 4, ... 1 ms between tests with the timer slack cut to 1 us (the kernel's
  // default 50 us made every nap at least 50 us late: tp's blocking all-reduces cost ~600 us each). On
  // the communication thread it spins only while the compute thread is blocked on it (otherwise the two
  // share the rank's core) and a nap ends when the compute thread blocks. With more ranks than cores (4
  // or 8 ranks on 2) it tests 64 times, then naps as above with the default slack, so that waiting
  // ranks leave the cores to the working ones (short naps there measured slower: their wake-ups
  // preempt the ranks that compute). docs/mesh.md, "The MPI wait".
  void wait(MPI_Request& req, const char* op, const std::vector<int>& group, MPI_Status* status = MPI_STATUS_IGNORE) {
    if (core_per_rank_) short_naps();
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    auto nap = std::chrono::microseconds(1);
    std::chrono::steady_clock::time_point spin_until{};  // set when polling may first spin
    for (int tests = 0;; ++tests) {
      int done = 0;
      LOOM_MPI(MPI_Test(&req, &done, status));
      if (done) return;
      if (tests < 64) continue;
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline) {
        mpi_abort(str("loom: rank ", rank_, ": ", op, " over ranks ", group_text(group), " got no answer within ",
                      timeout_.count() / 1000.0, " s: a peer rank has stopped (killed, crashed or lost); ending the job"),
                  3);
      }
      if (!core_per_rank_) {
        std::this_thread::sleep_for(nap);
      } else {
        if (!on_communication_thread() || compute_thread_blocked()) {  // nobody else wants this core
          if (spin_until == std::chrono::steady_clock::time_point{}) spin_until = now + kSpin;
          if (now < spin_until) {
            for (int i = 0; i < 16; ++i) cpu_relax();
            continue;
          }
        }
        Communicator::nap(nap);
      }
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
  static constexpr std::chrono::microseconds kSpin{200};

  // A nap of 1 us takes about 1 us, not the kernel's default timer slack of 50 us (set per thread).
  static void short_naps() {
#ifdef __linux__
    thread_local bool set = false;
    if (!set) prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);  // ns
    set = true;
#endif
  }
  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }

  // Whether this node has a core for each of its ranks (MPI_COMM_TYPE_SHARED: the ranks that share memory).
  bool core_per_rank() {
    MPI_Comm node;
    LOOM_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    int ranks = 1;
    MPI_Comm_size(node, &ranks);
    MPI_Comm_free(&node);
    return ranks <= static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }

  std::chrono::milliseconds timeout_;
  int rank_ = 0, size_ = 1;
  bool core_per_rank_ = false;
  std::map<std::vector<int>, MPI_Comm> comms_;
};

struct MpiSession {
  MpiSession() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;  // SERIALIZED: the communication thread of started collectives
    if (!initialized) LOOM_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~MpiSession() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

}  // namespace

bool mpi_built() { return true; }

std::shared_ptr<Communicator> mpi_world(std::chrono::milliseconds timeout) {
  static MpiSession session;  // finalised at exit, after the communicators are gone
  return std::make_shared<MpiCommunicator>(timeout);
}

void mpi_abort(const std::string& why, int status) {
  std::fprintf(stderr, "%s\n", why.c_str());
  std::fflush(stderr);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, status);
  std::exit(status);
}

}  // namespace loom::dist
