#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>

#include "core/error.h"

namespace loom::train {

double estimate_cpu_peak_flops(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double mhz = 2000;
  double per_cycle = 8;
  std::ifstream in("/proc/cpuinfo");
  bool got_mhz = false, got_flags = false;
  for (std::string line; std::getline(in, line) && !(got_mhz && got_flags);) {
    if (!got_mhz && line.rfind("cpu MHz", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) {
        double v = std::atof(line.c_str() + colon + 1);
        if (v > 100) mhz = v;
      }
      got_mhz = true;
    } else if (!got_flags && line.rfind("flags", 0) == 0) {
      std::string flags = line + " ";
      if (flags.find(" avx512f ") != std::string::npos) {
        per_cycle = 64;
      } else if (flags.find(" avx2 ") != std::string::npos && flags.find(" fma ") != std::string::npos) {
        per_cycle = 32;
      }
      got_flags = true;
    }
  }
  return threads * mhz * 1e6 * per_cycle;
}

ProgressMode progress_mode_from_name(const std::string& setting, std::FILE* out) {
  if (setting == "bar") return ProgressMode::Bar;
  if (setting == "lines") return ProgressMode::Lines;
  if (setting == "none") return ProgressMode::None;
  LOOM_CHECK(setting == "auto", "progress must be \"auto\", \"bar\", \"lines\" or \"none\", got \"", setting, "\"");
  return ::isatty(::fileno(out)) ? ProgressMode::Bar : ProgressMode::Lines;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(std::llround(seconds));
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>((s % 3600) / 60));
  }
  return buf;
}

namespace {
std::string format_rate(double tokens_per_s) {
  char buf[32];
  if (tokens_per_s >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2fM tok/s", tokens_per_s / 1e6);
  } else if (tokens_per_s >= 1e3) {
    std::snprintf(buf, sizeof(buf), "%.1fk tok/s", tokens_per_s / 1e3);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f tok/s", tokens_per_s);
  }
  return buf;
}
}  // namespace

Progress::Progress(int64_t total_steps, ProgressMode mode, std::FILE* out, int64_t start_step, Clock clock)
    : total_(total_steps), mode_(mode), out_(out), start_step_(start_step), step_(start_step) {
  LOOM_CHECK(total_steps > 0, "progress: total_steps must be positive, got ", total_steps);
  clock_ = clock ? std::move(clock) : Clock([] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  });
  t0_ = now();
}

std::optional<double> Progress::eta_seconds() const {
  int64_t done = step_ - start_step_;
  if (done <= 0) return std::nullopt;
  double rate = static_cast<double>(done) / std::max(now() - t0_, 1e-9);
  return static_cast<double>(std::max<int64_t>(total_ - step_, 0)) / rate;
}

void Progress::update(int64_t step) {
  step_ = step;
  if (mode_ != ProgressMode::Bar) return;
  double t = now();
  if (last_draw_ < 0 || t - last_draw_ >= 0.1 || step >= total_) {
    last_draw_ = t;
    draw_bar();
  }
}

void Progress::log(const TrainEvent& e) {
  step_ = std::max(step_, e.step);
  last_ = e;
  if (mode_ == ProgressMode::Bar) {
    draw_bar();
    return;
  }
  if (mode_ == ProgressMode::None) return;
  auto eta = eta_seconds();
  char buf[256];
  std::snprintf(buf, sizeof(buf), "step %lld/%lld | loss %.4f | lr %.2e | grad %.3f | %s | mfu %.1f%% | eta %s",
                static_cast<long long>(e.step), static_cast<long long>(total_), e.loss, e.lr, e.grad_norm,
                format_rate(e.tokens_per_s).c_str(), 100.0 * e.mfu, eta ? format_duration(*eta).c_str() : "?");
  print_line(buf);
}

void Progress::log_val(const ValEvent& e) {
  last_val_ = e.val_loss;
  if (mode_ == ProgressMode::None) return;
  char buf[128];
  std::snprintf(buf, sizeof(buf), "step %lld/%lld | val_loss %.4f", static_cast<long long>(e.step),
                static_cast<long long>(total_), e.val_loss);
  print_line(buf);
}

void Progress::note(const std::string& line) {
  if (mode_ == ProgressMode::None) return;
  print_line(line);
}

void Progress::finish() {
  if (mode_ == ProgressMode::Bar) {
    draw_bar();
    std::fputc('\n', out_);
    bar_visible_ = false;
  }
  std::fflush(out_);
}

void Progress::clear_bar() {
  if (bar_visible_) std::fputs("\r\x1b[K", out_);  // carriage return + erase to end of line
  bar_visible_ = false;
}

void Progress::print_line(const std::string& line) {
  clear_bar();
  std::fputs(line.c_str(), out_);
  std::fputc('\n', out_);
  if (mode_ == ProgressMode::Bar) draw_bar();
  std::fflush(out_);
}

void Progress::draw_bar() {
  constexpr int kWidth = 30;
  double frac = std::clamp(static_cast<double>(step_) / static_cast<double>(total_), 0.0, 1.0);
  int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::string text = str("step ", step_, "/", total_, " [", bar, "] ", static_cast<int>(frac * 100), "%");
  if (last_) {
    char buf[96];
    std::snprintf(buf, sizeof(buf), " | loss %.4f | %s", last_->loss, format_rate(last_->tokens_per_s).c_str());
    text += buf;
  }
  if (last_val_) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), " | val %.4f", *last_val_);
    text += buf;
  }
  auto eta = eta_seconds();
  text += " | eta " + (eta ? format_duration(*eta) : std::string("?"));
  std::fputs("\r\x1b[K", out_);
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
  bar_visible_ = true;
}

}  // namespace loom::train
