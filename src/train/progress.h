// Console progress for the training loop: a bar with an ETA redrawn in place on a terminal, plain log
// lines otherwise (a file, a pipe, CI logs).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>

#include "train/metrics.h"

namespace loom::train {

// Model FLOPs utilisation: achieved FLOP/s over the peak.
inline double mfu(double flops_per_token, double tokens_per_s, double peak_flops) {
  return peak_flops > 0 ? flops_per_token * tokens_per_s / peak_flops : 0.0;
}

// A rough fp32 peak for `threads` cores of this CPU: cores × clock × FLOPs/cycle, with 64 FLOPs/cycle
// for AVX-512 (two 16-lane FMA units), 32 for AVX2+FMA, 8 otherwise; the clock is /proc/cpuinfo's
// "cpu MHz" (2 GHz if absent). An estimate for MFU, not a measurement: set logging.peak_flops to override.
double estimate_cpu_peak_flops(int threads);
enum class ProgressMode
 { Bar, Lines, None };
// "auto" picks Bar when `out` is a terminal (isatty), Lines otherwise; "bar", "lines", "none" force.
ProgressMode progress_mode_from_name(const std::string& setting, std::FILE* out);

// "42s", "3m05s", "1h02m".
std::string format_duration(double seconds);

// Console progress for the training loop. The loop calls update() after every step, log() at each
// logging interval and log_val() after each validation pass; note() prints any other line. In Bar mode
// the bar is redrawn in place (at most 10 times a second) and lines are printed above it.
class Progress {
 public:
  using Clock = std::function<double()>;  // seconds, monotonic; injectable for tests

  Progress(int64_t total_steps, ProgressMode mode, std::FILE* out = stderr, int64_t start_step = 0,
           Clock clock = {});

  void update(int64_t step);
  void log(const TrainEvent& e);
  void log_val(const ValEvent& e);
  void note(const std::string& line);
  // Draws the final state and ends the bar's line.
  void finish();

  // Seconds left at the current rate; nullopt before the first completed step.
  std::optional<double> eta_seconds() const;
  ProgressMode mode() const { return mode_; }

 private:
  void draw_bar();
  void clear_bar();
  void print_line(const std::string& line);
  double now() const { return clock_(); }

  int64_t total_;
  ProgressMode mode_;
  std::FILE* out_;
  int64_t start_step_;
  Clock clock_;
  double t0_;
  int64_t step_;
  double last_draw_ = -1;
  bool bar_visible_ = false;
  std::optional<TrainEvent> last_;
  std::optional<double> last_val_;
};

}  // namespace loom::train
