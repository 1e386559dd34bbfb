#include "mesh/communicator.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "core/cpu_time.h"
#include "core/error.h"

namespace loom::dist {

std::vector<int> Communicator::world() const {
  std::vector<int> all(static_cast<size_t>(size()));
  for (int i = 0; i < size(); ++i) all[static_cast<size_t>(i)] = i;
  return all;
}

int Communicator::index_in(const std::vector<int>& group) const {
  auto it = std::find(group.begin(), group.end(), rank());
  LOOM_ASSERT(it != group.end(), "rank ", rank(), " is not in the group it runs a collective on");
  return static_cast<int>(it - group.begin());
}

// ---- Started collectives: one communication thread per communicator ----------------------------
// The thread runs the started collectives in order through the implementation's blocking calls, so a
// started collective is exactly the blocking one, run elsewhere. The caller's blocking collectives wait
// for the queue to empty first (Blocking), so collectives never run on both threads at once: MPI needs
// only MPI_THREAD_SERIALIZED, and the in-process rendezvous of a group never sees two of one rank's calls.
struct Communicator::Work {
  bool done = false;
  std::exception_ptr error;
};

struct Communicator::Async {
  std::mutex mutex;
  std::condition_variable cv;  // the queue grew, a collective finished, or stop
  std::deque<std::pair<Pending, std::function<void()>>> queue;
  int in_flight = 0;            // queued or running
  std::atomic<int> blocked{0};  // compute threads in wait()/wait_all() (changed under the mutex)
  bool stop = false;
  std::exception_ptr failure;   // the first started collective that threw
  std::thread thread;

  void run() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stopping, nothing left
      auto [work, collective] = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      std::exception_ptr error;
      try {
        collective();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      work->done = true;
      work->error = error;
      if (error && !failure) failure = error;
      --in_flight;
      cv.notify_all();
    }
  }
  // The compute thread blocks until `done`, telling the communication thread (whose transport then
  // polls without napping: the core is free) and waking it from a nap.
  template <typename Done>
  void block(std::unique_lock<std::mutex>& lock, Done done) {
    if (done()) return;
    ++blocked;
    cv.notify_all();
    cv.wait(lock, done);
    --blocked;
  }
  void shut_down() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stop = true;
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }
  ~Async() { shut_down(); }
};

Communicator::Pending Communicator::start(std::function<void()> collective) {
  ++stats.started;
  auto work = std::make_shared<Work>();
  if (run_started_inline_) {  // still correct, just not overlapped
    collective();
    work->done = true;
    return work;
  }
  if (!async_) {
    async_ = std::make_shared<Async>();
    Async* a = async_.get();
    a->thread = std::thread([a] { a->run(); });
  }
  {
    std::lock_guard<std::mutex> lock(async_->mutex);
    async_->queue.emplace_back(work, std::move(collective));
    ++async_->in_flight;
  }
  async_->cv.notify_all();
  return work;
}

Communicator::Pending Communicator::start_all_gather(const float* in, int64_t n, float* out,
                                                     const std::vector<int>& group) {
  return start([this, in, n, out, group] { all_gather(in, n, out, group); });
}
Communicator::Pending Communicator::start_reduce_scatter_sum(const float* in, int64_t n, float* out,
                                                             const std::vector<int>& group) {
  return start([this, in, n, out, group] { reduce_scatter_sum(in, n, out, group); });
}
Communicator::Pending Communicator::start_all_reduce_sum(float* data, int64_t n, const std::vector<int>& group) {
  return start([this, data, n, group] { all_reduce_sum(data, n, group); });
}

bool Communicator::on_communication_thread() const {
  return async_ && std::this_thread::get_id() == async_->thread.get_id();
}

bool Communicator::compute_thread_blocked() const { return on_communication_thread() && async_->blocked > 0; }

void Communicator::nap(std::chrono::microseconds d) {
  if (!on_communication_thread()) {
    std::this_thread::sleep_for(d);
    return;
  }
  // Ends early only when the compute thread blocks during the nap (not if it already was: a transport
  // that naps while it is blocked wants the nap).
  std::unique_lock<std::mutex> lock(async_->mutex);
  const int before = async_->blocked;
  async_->cv.wait_for(lock, d, [&] { return async_->blocked > before; });
}

void Communicator::wait(const Pending& work) {
  if (!work || !async_) return;  // null, or run inline
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = thread_cpu_seconds();
  std::unique_lock<std::mutex> lock(async_->mutex);
  async_->block(lock, [&] { return work->done; });
  stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.wait_cpu_seconds += thread_cpu_seconds() - cpu_start;
  if (work->error) std::rethrow_exception(work->error);
}

void Communicator::wait_all() {
  if (!async_) return;
  std::unique_lock<std::mutex> lock(async_->mutex);
  async_->block(lock, [&] { return async_->in_flight == 0; });
  if (async_->failure) std::rethrow_exception(async_->failure);
}

void Communicator::settle() {
  if (async_ && std::this_thread::get_id() != async_->thread.get_id()) wait_all();
}

Communicator::Blocking::Blocking(Communicator& c) : c_(&c), start_(std::chrono::steady_clock::now()) {
  if (c.async_ && std::this_thread::get_id() == c.async_->thread.get_id()) {
    c_ = nullptr;  // a started collective, on the communication thread: nothing to wait for or count
    return;
  }
  cpu_start_ = thread_cpu_seconds();  // a system call: only where the call is counted
  c.wait_all();
}

Communicator::Blocking::~Blocking() {
  if (!c_) return;
  c_->stats.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  c_->stats.wait_cpu_seconds += thread_cpu_seconds() - cpu_start_;
}

void Communicator::stop_communication_thread() {
  if (async_) async_->shut_down();
}

// One rendezvous per group (keyed by its member list). A collective is two barriers: members publish
// their buffers, meet, each computes its own result reading the others' inputs, meet again (after which
// nobody reads), and only then writes in place. Every wait is bounded and gives up when the world fails.
struct InProcessWorld::State {
  struct Rendezvous {
    int arrived = 0;
    uint64_t generation = 0;
    std::vector<const void*> inputs;
  };
  int size = 0;
  std::chrono::milliseconds timeout;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::vector<int>, Rendezvous> groups;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mail;  // (from, to): messages in send order
  bool failed = false;
  std::string failure;

  Rendezvous& rendezvous(const std::vector<int>& group) {
    auto& r = groups[group];
    if (r.inputs.size() != group.size()) r.inputs.assign(group.size(), nullptr);
    return r;
  }

  // Waits until every member of `group` has reached this point (publishing `input` at `index`).
  void meet(const std::vector<int>& group, int index, const void* input, const char* op, int rank) {
    std::unique_lock<std::mutex> lock(mutex);
    if (failed) throw Error(str("rank ", rank, ": ", op, " abandoned: ", failure));
    Rendezvous& r = rendezvous(group);
    if (input != nullptr) r.inputs[static_cast<size_t>(index)] = input;
    const uint64_t gen = r.generation;
    if (++r.arrived == static_cast<int>(group.size())) {
      r.arrived = 0;
      ++r.generation;
      cv.notify_all();
      return;
    }
    const bool met = cv.wait_for(lock, timeout, [&] { return r.generation != gen || failed; });
    if (failed) throw Error(str("rank ", rank, ": ", op, " abandoned: ", failure));
    if (!met) {
      failed = true;
      failure = str(op, " timed out after ", timeout.count(), " ms waiting for the other ranks of the group");
      cv.notify_all();
      throw Error(str("rank ", rank, ": ", failure));
    }
  }
  const void* input(const std::vector<int>& group, int index) {
    std::lock_guard<std::mutex> lock(mutex);
    return rendezvous(group).inputs[static_cast<size_t>(index)];
  }
};

namespace {

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(InProcessWorld::State& s, int rank) : s_(s), rank_(rank) {}
  ~InProcessCommunicator() override { stop_communication_thread(); }
  int rank() const override { return rank_; }
  int size() const override { return s_.size; }
  std::string kind() const override { return "in-process"; }

  void all_reduce_sum(float* data, int64_t n, const std::vector<int>& group) override {
    Blocking guard(*this);
    reduce_all(data, n, group);
    stats.all_reduce_bytes += n * 4;
  }
  void all_reduce_sum(double* data, int64_t n, const std::vector<int>& group) override {
    Blocking guard(*this);
    reduce_all(data, n, group);
    stats.all_reduce_bytes += n * 8;
  }

  void all_gather(const float* in, int64_t n, float* out, const std::vector<int>& group) override {
    Blocking guard(*this);
    const int me = begin(group);
    s_.meet(group, me, in, "all_gather", rank_);
    for (size_t i = 0; i < group.size(); ++i) {
      const auto* src = static_cast<const float*>(s_.input(group, static_cast<int>(i)));
      std::memcpy(out + static_cast<int64_t>(i) * n, src, static_cast<size_t>(n) * sizeof(float));
    }
    s_.meet(group, me, nullptr, "all_gather", rank_);
    stats.all_gather_bytes += n * 4;
  }

  void reduce_scatter_sum(const float* in, int64_t n, float* out, const std::vector<int>& group) override {
    Blocking guard(*this);
    const int me = begin(group);
    s_.meet(group, me, in, "reduce_scatter", rank_);
    std::vector<float> acc(static_cast<size_t>(n), 0.0f);
    for (size_t i = 0; i < group.size(); ++i) {
      const float* src = static_cast<const float*>(s_.input(group, static_cast<int>(i))) + static_cast<int64_t>(me) * n;
      for (int64_t j = 0; j < n; ++j) acc[static_cast<size_t>(j)] += src[j];
    }
    s_.meet(group, me, nullptr, "reduce_scatter", rank_);
    std::memcpy(out, acc.data(), static_cast<size_t>(n) * sizeof(float));
    stats.reduce_scatter_bytes += n * static_cast<int64_t>(group.size()) * 4;
  }

  void broadcast(float* data, int64_t n, int root, const std::vector<int>& group) override {
    Blocking guard(*this);
    const int me = begin(group);
    auto it = std::find(group.begin(), group.end(), root);
    LOOM_ASSERT(it != group.end(), "broadcast root ", root, " is not in the group");
    s_.meet(group, me, data, "broadcast", rank_);
    std::vector<float> copy(static_cast<size_t>(n));
    std::memcpy(copy.data(), s_.input(group, static_cast<int>(it - group.begin())), static_cast<size_t>(n) * sizeof(float));
    s_.meet(group, me, nullptr, "broadcast", rank_);
    if (rank_ != root) std::memcpy(data, copy.data(), static_cast<size_t>(n) * sizeof(float));
    stats.broadcast_bytes += rank_ == root ? n * 4 : 0;
  }

  void barrier(const std::vector<int>& group) override {
    Blocking guard(*this);
    const int me = begin(group);
    s_.meet(group, me, nullptr, "barrier", rank_);
  }

  void all_to_all_counts(const int64_t* send, int64_t* recv, const std::vector<int>& group) override {
    Blocking guard(*this);
    const int me = begin(group);
    s_.meet(group, me, send, "all_to_all_counts", rank_);
    for (size_t i = 0; i < group.size(); ++i) recv[i] = static_cast<const int64_t*>(s_.input(group, static_cast<int>(i)))[me];
    s_.meet(group, me, nullptr, "all_to_all_counts", rank_);
  }

  void all_to_all_v(const float* in, const int64_t* send_counts, float* out, const int64_t* recv_counts,
                    const std::vector<int>& group) override {
    Blocking guard(*this);
    struct Published {
      const float* in;
      const int64_t* counts;
    } mine{in, send_counts};
    const int me = begin(group);
    const size_t g = group.size();
    s_.meet(group, me, &mine, "all_to_all_v", rank_);
    int64_t at = 0;
    for (size_t i = 0; i < g; ++i) {
      const auto* peer = static_cast<const Published*>(s_.input(group, static_cast<int>(i)));
      int64_t offset = 0;  // where member i's block for me starts in its buffer
      for (int j = 0; j < me; ++j) offset += peer->counts[j];
      LOOM_ASSERT(peer->counts[me] == recv_counts[i], "all_to_all_v: member ", i, " sends ", peer->counts[me],
                  " floats, rank ", rank_, " expects ", recv_counts[i]);
      std::memcpy(out + at, peer->in + offset, static_cast<size_t>(recv_counts[i]) * sizeof(float));
      at += recv_counts[i];
      if (static_cast<int>(i) != me) stats.all_to_all_bytes += send_counts[i] * 4;
    }
    s_.meet(group, me, nullptr, "all_to_all_v", rank_);
  }

  void send(const float* data, int64_t n, int dst) override {
    Blocking guard(*this);
    settle();
    LOOM_ASSERT(dst >= 0 && dst < s_.size && dst != rank_, "send: rank ", rank_, " to ", dst);
    std::lock_guard<std::mutex> lock(s_.mutex);
    s_.mail[{rank_, dst}].emplace_back(data, data + n);
    stats.send_bytes += n * 4;
    ++stats.sends;
    ++stats.calls;
    s_.cv.notify_all();
  }

  void recv(float* data, int64_t n, int src) override {
    Blocking guard(*this);
    settle();
    LOOM_ASSERT(src >= 0 && src < s_.size && src != rank_, "recv: rank ", rank_, " from ", src);
    std::unique_lock<std::mutex> lock(s_.mutex);
    auto& box = s_.mail[{src, rank_}];
    const bool arrived = s_.cv.wait_for(lock, s_.timeout, [&] { return !box.empty() || s_.failed; });
    if (s_.failed) throw Error(str("rank ", rank_, ": recv from rank ", src, " abandoned: ", s_.failure));
    if (!arrived) {
      s_.failed = true;
      s_.failure = str("recv from rank ", src, " timed out after ", s_.timeout.count(), " ms");
      s_.cv.notify_all();
      throw Error(str("rank ", rank_, ": ", s_.failure));
    }
    std::vector<float> m = std::move(box.front());
    box.pop_front();
    LOOM_CHECK(static_cast<int64_t>(m.size()) == n, "recv: rank ", rank_, " expected ", n, " floats from rank ", src,
               ", the message holds ", m.size());
    std::memcpy(data, m.data(), static_cast<size_t>(n) * sizeof(float));
    ++stats.calls;
  }

 private:
  int begin(const std::vector<int>& group) {
    settle();  // (Blocking did already, in the collectives above)
    ++stats.calls;
    return index_in(group);
  }
  template <typename T>
  void reduce_all(T* data, int64_t n, const std::vector<int>& group) {
    const int me = begin(group);
    s_.meet(group, me, data, "all_reduce", rank_);
    std::vector<T> acc(static_cast<size_t>(n), T(0));
    for (size_t i = 0; i < group.size(); ++i) {  // in group order: the same bits on every member
      const T* src = static_cast<const T*>(s_.input(group, static_cast<int>(i)));
      for (int64_t j = 0; j < n; ++j) acc[static_cast<size_t>(j)] += src[j];
    }
    s_.meet(group, me, nullptr, "all_reduce", rank_);
    std::memcpy(data, acc.data(), static_cast<size_t>(n) * sizeof(T));
  }

  InProcessWorld::State& s_;
  int rank_;
};

}  // namespace

void Communicator::send(const float*, int64_t, int dst) {
  LOOM_FAIL("the ", kind(), " communicator has no point-to-point send (rank ", rank(), " to ", dst,
            "): the pipe axis needs the in-process or MPI communicator");
}

void Communicator::recv(float*, int64_t, int src) {
  LOOM_FAIL("the ", kind(), " communicator has no point-to-point recv (rank ", rank(), " from ", src,
            "): the pipe axis needs the in-process or MPI communicator");
}

InProcessWorld::InProcessWorld(int size, std::chrono::milliseconds timeout) : state_(std::make_unique<State>()) {
  LOOM_CHECK(size >= 1, "InProcessWorld: size must be >= 1, got ", size);
  state_->size = size;
  state_->timeout = timeout;
  for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<InProcessCommunicator>(*state_, r));
}

InProcessWorld::~InProcessWorld() = default;

int InProcessWorld::size() const { return state_->size; }

Communicator& InProcessWorld::communicator(int rank) {
  LOOM_CHECK(rank >= 0 && rank < size(), "InProcessWorld: rank ", rank, " outside [0, ", size(), ")");
  return *comms_[static_cast<size_t>(rank)];
}

void InProcessWorld::abort(int rank, const std::string& why) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->failed) {
    state_->failed = true;
    state_->failure = str("rank ", rank, " failed: ", why);
  }
  state_->cv.notify_all();
}

void run_in_process(int size, const std::function<void(int, Communicator&)>& fn) {
  InProcessWorld world(size);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::string> messages(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, world.communicator(r));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        messages[static_cast<size_t>(r)] = e.what();
        world.abort(r, e.what());
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        messages[static_cast<size_t>(r)] = "unknown exception";
        world.abort(r, "unknown exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  // The root cause: the first rank whose failure is not "abandoned" because of another's.
  int first = -1;
  for (int r = 0; r < size; ++r) {
    if (!errors[static_cast<size_t>(r)]) continue;
    if (first < 0) first = r;
    if (messages[static_cast<size_t>(r)].find(" abandoned: ") == std::string::npos) {
      first = r;
      break;
    }
  }
  if (first >= 0) {
    try {
      std::rethrow_exception(errors[static_cast<size_t>(first)]);
    } catch (const Error& e) {
      throw Error(str("rank ", first, ": ", e.what()));
    }
  }
}

}  // namespace loom::dist
