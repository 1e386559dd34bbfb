// A line of status for a wait the user would otherwise sit through without a word (issue 32): loading a
// model, a long prompt's prefill, an eval over many windows. Nothing is printed when the work ends within
// `after` seconds (the common case, and every test); past it, one line on stderr says what loom is doing,
// and a second one how long it took.
//
//   { loom::cli::Status status("generate: loading runs/x"); auto loaded = load(...); }
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

namespace loom::cli {

class Status {
 public:
  explicit Status(std::string what, double after_seconds = 2.0)
      : what_(std::move(what)), start_(std::chrono::steady_clock::now()) {
    thread_ = std::thread([this, after_seconds] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (cv_.wait_for(lock, std::chrono::duration<double>(after_seconds), [this] { return done_; })) return;
      std::fprintf(stderr, "%s ...\n", what_.c_str());
      printed_ = true;
    });
  }
  ~Status() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (printed_) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      std::fprintf(stderr, "%s: done in %.1f s\n", what_.c_str(), s);
    }
  }
  Status(const Status&) = delete;
  Status& operator=(const Status&) = delete;

 private:
  std::string what_;
  std::chrono::steady_clock::time_point start_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false, printed_ = false;
  std::thread thread_;
};

}  // namespace loom::cli
