// Runs work over the chunks of a TextChunker on worker threads while the calling thread reads the
// next chunks and consumes finished results in order. At most 2 * threads chunks are in flight, so
// memory stays bounded whatever the input size. Workers sleep on a condition variable when idle (no
// spinning: the machine may be busy with other work). threads == 1 runs everything on the calling
// thread and starts no thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/error.h"
#include "tokenizer/pretokenizer.h"

namespace loom::tokenizer {

// work(const std::string& chunk, int worker) -> Result; consume(Result&) is called in chunk order.
template <typename Result, typename Work, typename Consume>
void run_chunk_pipeline(TextChunker& chunker, int threads, Work&& work, Consume&& consume) {
  if (threads <= 1) {
    std::string chunk;
    while (chunker.next(chunk)) {
      Result r = work(chunk, 0);
      consume(r);
    }
    return;
  }
  std::mutex mu;
  std::condition_variable job_ready, result_ready;
  std::map<uint64_t, std::string> jobs;  // seq -> text, taken in seq order
  std::map<uint64_t, Result> results;
  bool closing = false;
  std::exception_ptr error;
  auto worker_loop = [&](int index) {
    while (true) {
      std::string text;
      uint64_t seq;
      {
        std::unique_lock lock(mu);
        job_ready.wait(lock, [&] { return closing || !jobs.empty(); });
        if (jobs.empty()) return;
        seq = jobs.begin()->first;
        text = std::move(jobs.begin()->second);
        jobs.erase(jobs.begin());
      }
      try {
        Result r = work(text, index);
        std::lock_guard lock(mu);
        results.emplace(seq, std::move(r));
      } catch (...) {
        std::lock_guard lock(mu);
        if (!error) error = std::current_exception();
      }
      result_ready.notify_all();
    }
  };
  std::vector<std::thread> workers;
  auto stop = [&] {
    {
      std::lock_guard lock(mu);
      closing = true;
      jobs.clear();
    }
    job_ready.notify_all();
    for (auto& w : workers) w.join();
  };
  // A thread the system refuses (a process or container thread limit) must not leave the started
  // ones joinable: destroying a joinable std::thread calls std::terminate.
  for (int i = 0; i < threads; ++i) {
    try {
      workers.emplace_back(worker_loop, i);
    } catch (const std::system_error& e) {
      stop();
      LOOM_FAIL("could not start worker thread ", i + 1, " of ", threads, " (", e.what(),
                "); ask for fewer threads");
    }
  }
  try {
    const uint64_t max_in_flight = static_cast<uint64_t>(threads) * 2;
    uint64_t next_seq = 0, consumed = 0;
    bool input_done = false;
    std::string chunk;
    while (true) {
      // Keep the workers fed.
      while (!input_done && next_seq - consumed < max_in_flight) {
        if (!chunker.next(chunk)) {
          input_done = true;
          break;
        }
        {
          std::lock_guard lock(mu);
          jobs.emplace(next_seq++, std::move(chunk));
        }
        chunk = std::string();
        job_ready.notify_one();
      }
      if (input_done && consumed == next_seq) break;
      // Consume the next result in order.
      Result r;
      {
        std::unique_lock lock(mu);
        result_ready.wait(lock, [&] { return error || results.count(consumed) > 0; });
        if (error) std::rethrow_exception(error);
        auto it = results.find(consumed);
        r = std::move(it->second);
        results.erase(it);
      }
      consume(r);
      ++consumed;
    }
  } catch (...) {
    stop();
    throw;
  }
  stop();
}

}  // namespace loom::tokenizer
