// What one collective costs a training step on this machine, through loom's own communicator (its MPI
// waits and their naps, its communication thread), measured the way a step meets it: every rank
// computes for a while, then calls the collective (docs/plan.md, "The network of this CPU").
//
//   mpirun --oversubscribe -np R loom_bench_collectives [--group G] [--calls N] [--reps K] [--gaps-us 100,400]
//       [--bytes 8,16384,131072,1048576] [--kinds all_reduce,...] [--gap-bytes B]
//
// The R ranks form R / G groups of G consecutive ranks (as a mesh's innermost axis: tensor), each group
// running its collectives at the same time as the others. For every kind (all_reduce, all_gather,
// reduce_scatter, send_recv: a message to the next rank of the group and one back, as a pipeline's
// activations and their gradients; started_all_gather: started, then waited for after the gap, as FSDP's
// prefetch), payload (bytes as CommStats counts them: an all-reduce's buffer, an all-gather's input, a
// reduce-scatter's whole input, a message) and gap (compute between calls, in microseconds of one core's
// CPU time), each rank runs N rounds of [compute the gap, the collective] and, separately, N rounds of
// the gap alone, alternating, `reps` times. The collective's cost (per_call_s) is what adding it to the
// step adds to its time. With a core per rank: the ranks' mean time inside the call (a started one's
// start and wait), the median over the reps, measured directly. With more ranks than cores: the median
// difference of the two rounds' wall times per call, the slowest rank's, with the scheduling and wake-ups
// the call brings (the gap alone already counts its share of the cores). Both are printed
// (in_call_s, rounds_difference_s); at 2 ranks the difference, two wall times of 1-4 ms, swung by
// hundreds of microseconds per call between runs minutes apart and came out negative at the 400 us gap.
// The ranks' mean CPU time in the rounds with the collective, less the gaps' own (every thread: the MPI
// waits' polling and naps, the copies, the communication thread), per call is the CPU a call takes from
// the cores (cpu_per_call_s): what it costs a step whose cores are all busy, whatever the wait.
// --gap-bytes B: the gap walks a working set of B bytes of its own (a multiply-add per float, the same
// work at any speed) instead of staying in registers, as a step's compute walks its weights and
// activations. With more ranks than cores every call is then a switch that brings another rank's
// working set into the core's caches, and the gap after it runs slower: cpu_with_gaps_per_call_s, the
// ranks' whole CPU (gaps included) in the rounds with the call less in the rounds without, per call,
// counts that too (cpu_per_call_s, which takes the gaps' own CPU off, does not).
// Rank 0 prints one JSON line per case; tools/measure_collectives.py fits them and writes the data file
// the planner reads (docs/plan/cpu-collectives.json).

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/cpu_time.h"
#include "mesh/mpi.h"

using namespace loom;

namespace {

// Compute that stays in registers and L1: `iters` rounds of 64 multiply-adds. Not inlined: inlined into
// each round's lambda, GCC compiled it two ways, and the gap-alone rounds ran 2.3x slower per gap than the
// rounds with calls (with more ranks than cores their differences came out negative).
float sink = 0;
__attribute__((noinline)) void work(int64_t iters) {
  float a[64];
  for (int j = 0; j < 64; ++j) a[j] = static_cast<float>(j) * 1e-3f + sink;
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 64; ++j) a[j] = a[j] * 0.9999f + 1e-4f;
  }
  float s = 0;
  for (int j = 0; j < 64; ++j) s += a[j];
  sink = s;
}

// --gap-bytes: `iters` multiply-adds over the working set, one a float, from where the last gap stopped.
std::vector<float> working_set;
size_t walk_at = 0;
__attribute__((noinline)) void walk(int64_t iters) {
  float* w = working_set.data();
  const size_t n = working_set.size();
  for (int64_t i = 0; i < iters; ++i) {
    w[walk_at] = w[walk_at] * 0.9999f + 1e-4f;
    if (++walk_at == n) walk_at = 0;
  }
}

// The gap's compute: in registers, or over the working set with --gap-bytes.
void gap_work(int64_t iters) { working_set.empty() ? work(iters) : walk(iters); }

// Rounds of the gap's work per microsecond of this thread's CPU time, the working set (if any) warm in
// the caches (the best of a few tries: CPU time does not count the time another process held the core).
double iters_per_us() {
  double best = 0;
  for (int t = 0; t < 5; ++t) {
    const int64_t n = working_set.empty() ? 20000 : static_cast<int64_t>(working_set.size());
    if (!working_set.empty()) walk(n);  // warm
    const double a = thread_cpu_seconds();
    gap_work(n);
    const double s = thread_cpu_seconds() - a;
    if (s > 0) best = std::max(best, static_cast<double>(n) / (s * 1e6));
  }
  return best;
}

// `text` as a whole number, or exit naming the flag and the value.
int64_t number(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) {
    std::fprintf(stderr, "%s: '%s' is not a whole number\n", flag.c_str(), text.c_str());
    std::exit(2);
  }
  return v;
}

// A count (--group, --calls, --reps): a whole number that fits an int.
int count(const std::string& flag, const std::string& text) {
  const int64_t v = number(flag, text);
  if (v < INT32_MIN || v > INT32_MAX) {
    std::fprintf(stderr, "%s: %s is out of range\n", flag.c_str(), text.c_str());
    std::exit(2);
  }
  return static_cast<int>(v);
}

std::vector<int64_t> list_of(const std::string& flag, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(number(flag, item));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int group_size = 0, calls = 10, reps = 5;
  int64_t gap_bytes = 0;
  std::string gaps_text = "100,400", bytes_text = "8,16384,131072,1048576";
  std::string kinds_text = "all_reduce,all_gather,reduce_scatter,send_recv,started_all_gather";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s wants a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--group") group_size = count(a, next());
    else if (a == "--calls") calls = count(a, next());
    else if (a == "--reps") reps = count(a, next());
    else if (a == "--gaps-us") gaps_text = next();
    else if (a == "--bytes") bytes_text = next();
    else if (a == "--kinds") kinds_text = next();
    else if (a == "--gap-bytes") gap_bytes = number(a, next());
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  auto comm = dist::mpi_world();
  const int rank = comm->rank(), world = comm->size();
  if (group_size <= 0) group_size = world;
  if (group_size < 2 || world % group_size != 0 || calls < 1 || reps < 1 || gap_bytes < 0 || gap_bytes > (int64_t{1} << 32)) {
    if (rank == 0) {
      std::fprintf(stderr, "--group %d must be >= 2 and divide the %d ranks; --calls %d and --reps %d >= 1; --gap-bytes %lld in [0, 2^32]\n",
                   group_size, world, calls, reps, static_cast<long long>(gap_bytes));
    }
    return 2;
  }
  if (gap_bytes > 0) working_set.assign(static_cast<size_t>(std::max<int64_t>(1, gap_bytes / 4)), 1.0f);
  std::vector<int> group;
  for (int r = rank / group_size * group_size; r < (rank / group_size + 1) * group_size; ++r) group.push_back(r);
  const int me = comm->index_in(group);
  const double rate = iters_per_us();
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());

  std::vector<std::string> kinds;
  {
    std::stringstream ss(kinds_text);
    std::string k;
    while (std::getline(ss, k, ',')) kinds.push_back(k);
  }
  // The slowest rank's wall time of `calls` rounds of body(), all ranks starting together, and the
  // ranks' mean CPU time (every thread of the process) over them.
  // The CPU is the process's (every thread) less what the gaps' compute took on this thread: the calls'
  // own CPU on the calling thread, the communication thread's, MPI's.
  struct Timing {
    double wall = 0, cpu = 0, in_call = 0, cpu_total = 0;  // cpu_total: the gaps' CPU included
  };
  double work_cpu = 0, in_call = 0;
  auto compute = [&](int64_t iters) {
    const double a = thread_cpu_seconds();
    gap_work(iters);
    work_cpu += thread_cpu_seconds() - a;
  };
  auto timed = [&](auto&& body) {
    comm->barrier(comm->world());
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = process_cpu_seconds();
    work_cpu = 0;
    in_call = 0;
    for (int c = 0; c < calls; ++c) body();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu_total = process_cpu_seconds() - cpu_start, cpu = cpu_total - work_cpu;
    std::vector<double> all(static_cast<size_t>(4 * world), 0.0);
    all[static_cast<size_t>(rank)] = s;
    all[static_cast<size_t>(world + rank)] = cpu;
    all[static_cast<size_t>(2 * world + rank)] = in_call;
    all[static_cast<size_t>(3 * world + rank)] = cpu_total;
    comm->all_reduce_sum(all.data(), 4 * world, comm->world());
    double cpu_sum = 0, in_call_sum = 0, total_sum = 0;
    for (int r = 0; r < world; ++r) {
      cpu_sum += all[static_cast<size_t>(world + r)];
      in_call_sum += all[static_cast<size_t>(2 * world + r)];
      total_sum += all[static_cast<size_t>(3 * world + r)];
    }
    return Timing{*std::max_element(all.begin(), all.begin() + world), cpu_sum / world, in_call_sum / world,
                  total_sum / world};
  };
  for (const std::string& kind : kinds) {
    for (int64_t bytes : list_of("--bytes", bytes_text)) {
      for (int64_t gap : list_of("--gaps-us", gaps_text)) {
        const int64_t iters = static_cast<int64_t>(rate * static_cast<double>(gap));
        const int64_t n = std::max<int64_t>(1, bytes / 4);
        // The buffers: a reduce-scatter's input is the whole g blocks; an all-gather's output g inputs.
        std::vector<float> in(static_cast<size_t>(n * group_size), 1.0f), out(static_cast<size_t>(n * group_size), 0.0f);
        const int64_t block = kind == "reduce_scatter" ? std::max<int64_t>(1, n / group_size) : n;
        auto call = [&] {
          if (kind == "all_reduce") comm->all_reduce_sum(in.data(), n, group);
          else if (kind == "all_gather") comm->all_gather(in.data(), n, out.data(), group);
          else if (kind == "reduce_scatter") comm->reduce_scatter_sum(in.data(), block, out.data(), group);
          else if (kind == "send_recv") {
            // The next rank of the group and back: every rank sends one message and receives one.
            const int next = group[static_cast<size_t>((me + 1) % group_size)];
            const int prev = group[static_cast<size_t>((me + group_size - 1) % group_size)];
            if (me % 2 == 0) {
              comm->send(in.data(), n, next);
              comm->recv(out.data(), n, prev);
            } else {
              comm->recv(out.data(), n, prev);
              comm->send(in.data(), n, next);
            }
          } else if (kind == "started_all_gather") {
            auto t = std::chrono::steady_clock::now();
            auto pending = comm->start_all_gather(in.data(), n, out.data(), group);
            in_call += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
            compute(iters);
            t = std::chrono::steady_clock::now();
            comm->wait(pending);
            in_call += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
            return;
          } else {
            if (rank == 0) std::fprintf(stderr, "unknown kind %s\n", kind.c_str());
            std::exit(2);
          }
        };
        // started_all_gather computes its gap while the gather runs (the overlap FSDP does).
        const bool overlapped = kind == "started_all_gather";
        auto with_call = [&] {
          if (overlapped) {
            call();  // times its own start and wait
            return;
          }
          compute(iters);
          const auto t = std::chrono::steady_clock::now();
          call();
          in_call += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        };
        timed(with_call);  // warm-up (groups, buffers)
        // Rounds with and without the collective, alternating; the median of their differences (other
        // jobs on the machine take cores at random moments: a median keeps one unlucky round out).
        std::vector<double> alone(static_cast<size_t>(reps)), with(alone.size()), diff(alone.size()), cpu_diff(alone.size()),
            inside(alone.size()), cpu_total_diff(alone.size());
        for (int k = 0; k < reps; ++k) {
          const Timing a = timed([&] { compute(iters); }), w = timed(with_call);
          alone[static_cast<size_t>(k)] = a.wall;
          with[static_cast<size_t>(k)] = w.wall;
          diff[static_cast<size_t>(k)] = w.wall - a.wall;
          cpu_diff[static_cast<size_t>(k)] = w.cpu;
          inside[static_cast<size_t>(k)] = w.in_call;
          cpu_total_diff[static_cast<size_t>(k)] = w.cpu_total - a.cpu_total;
        }
        comm->complete_sends();
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        if (rank == 0) {
          nlohmann::json j = {{"ranks", world},
                              {"cores", cores},
                              {"group", group_size},
                              {"kind", kind},
                              {"bytes", kind == "send_recv" ? n * 4 : kind == "reduce_scatter" ? block * 4 * group_size : n * 4},
                              {"gap_us", gap},
                              {"calls", calls},
                              {"reps", reps},
                              {"gap_alone_s", median(alone) / calls},
                              {"with_call_s", median(with) / calls},
                              // With a core per rank nothing else competes for the cores: the time the
                              // ranks spend inside the call (their mean) is what it adds, measured directly
                              // (the difference of two rounds' wall times swung by hundreds of microseconds
                              // per call at 2 ranks). With more ranks than cores a waiting rank's time is
                              // another's compute: only the rounds' difference says what the call adds.
                              {"per_call_s", (world <= static_cast<int>(cores) ? median(inside) : median(diff)) / calls},
                              {"rounds_difference_s", median(diff) / calls},
                              {"in_call_s", median(inside) / calls},
                              {"cpu_per_call_s", median(cpu_diff) / calls},
                              {"gap_bytes", gap_bytes},
                              {"cpu_with_gaps_per_call_s", median(cpu_total_diff) / calls}};
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
