// What a training run records: DIR/metrics.jsonl, one JSON object per event, flushed per line, for
// `loom plot` and later analysis. (The console side is train/progress.h.)
//
// metrics.jsonl events:
//   {"event":"train","step":S,"loss":L,"lr":..,"grad_norm":..,"tokens_per_s":..,"mfu":..}
//   {"event":"val","step":S,"val_loss":L}
//   anything else the loop writes through write() (e.g. {"event":"skip","step":S,...}).
// Numbers are written in the shortest form that reads back to the same double, so two runs with the same
// seed give byte-identical loss fields. A non-finite number is written as null (JSON has no NaN).
#pragma once

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::train {

struct TrainEvent {
  int64_t step = 0;  // optimizer steps completed
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double mfu = 0;  // model FLOPs utilisation, a fraction (0.05 = 5%)
  // The family's own measurements since the last train event (LanguageModel::take_training_metrics),
  // merged into the event's object: DeepSeek-V3's main_loss, mtp_loss, balance_loss, expert loads, biases.
  nlohmann::json model = nlohmann::json::object();
};

struct ValEvent {
  int64_t step = 0;
  double val_loss = 0;
};

nlohmann::json to_json(const TrainEvent& e);
nlohmann::json to_json(const ValEvent& e);

class MetricsWriter {
 public:
  // Opens <run_dir>/metrics.jsonl (creating run_dir). A fresh run truncates it. A resumed run passes
  // `resume_step`: earlier events up to and including that step are kept and later ones (written after
  // the checkpoint by the interrupted run) are dropped, so the file reads as one uninterrupted run.
  // `redo_val_at_resume_step`: the checkpoint's validation was interrupted (its trainer state says
  // val_pending) and the resumed run validates that step again, so a val event of that step, which an
  // earlier resume may have written before it was killed, is dropped too (else it would appear twice).
  explicit MetricsWriter(const std::string& run_dir, std::optional<int64_t> resume_step = std::nullopt,
                         bool redo_val_at_resume_step = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void train(const TrainEvent& e);
  void val(const ValEvent& e);
  // Writes any JSON object as one line and flushes it.
  void write(const nlohmann::json& event);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

// Reads a metrics.jsonl file: one object per non-empty line. A malformed line throws naming its number,
// except a truncated last line (a run killed mid-write), which is skipped.
std::vector<nlohmann::json> read_metrics(const std::string& path);

// Median tokens_per_s over a run's train events, skipping the first (warm-up) one; nullopt if none.
std::optional<double> median_tokens_per_s(const std::vector<nlohmann::json>& events);

}  // namespace loom::train
